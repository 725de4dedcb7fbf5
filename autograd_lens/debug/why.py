"""``%%lens --why NAME``: the three debugging answers for one tensor, as plain HTML tables (and text).

>>> import torch, autograd_lens as al
>>> x = torch.tensor(2.0, requires_grad=True)
>>> w = torch.tensor(3.0, requires_grad=True)
>>> with al.Lens(names={"x": x, "w": w}, why=True) as lens:
...     (x * w.detach()).backward()
>>> print(Why(lens, "w"))
why w
where the gradient stopped:
  pass 1: detached (.detach(), .data, .item(), .tolist(), NumPy): w went through .detach(), and this graph uses the result
where NaN or inf started:
  every recorded gradient is finite
which paths it took:
  paths to w: unknown (no recorded pass reaches a leaf named w: no path from a root leads to it (unreached says why))
"""

from __future__ import annotations

import html
from typing import Any


class Why:
    """Where ``name``'s gradient stopped, where NaN or inf started, and which paths it took, over a Lens's passes."""

    def __init__(self, lens: Any, name: str) -> None:
        self.lens = lens
        self.name = name

    def rows(self) -> dict[str, list[tuple[str, ...]]]:
        """Each section's table rows (plain strings), in pass order."""
        from . import forward_nonfinite, safe_paths_to

        stopped, nonfinite = [], []
        forward = forward_nonfinite(self.lens.passes[-1]) if self.lens.passes else (None, None)
        for backward_pass in self.lens.passes:
            number = str(backward_pass.index + 1)
            reason = backward_pass.unreached.get(self.name)
            if reason is not None:
                stopped.append((number, reason.title, reason.text))
            origin = backward_pass.first_nonfinite
            if origin is not None:
                where = origin.source.describe() if origin.source is not None else ""
                what = f"{origin.name} [{origin.label}]" + (f" ({origin.note})" if origin.note else "")
                nonfinite.append((number, what, origin.inputs, origin.outputs, where))
        if forward[0] is not None:
            where = forward[1].describe() if forward[1] is not None else ""
            first = "the block's first NaN or inf" if not getattr(forward[0], "given_before", "") else \
                f"the block's first call to make NaN or inf from finite values; {forward[0].given_before} returned " \
                "NaN or inf earlier, from NaN or inf it was given"
            nonfinite.insert(0, ("", f"forward: {forward[0].op} ({first})", forward[0].inputs,
                                 forward[0].output, where))
        if not nonfinite:
            everything = "every recorded gradient is finite" if len(self.lens.passes) == 1 else \
                "every recorded gradient of every pass is finite"
            nonfinite.append(("", everything if self.lens.passes else "no pass was recorded", "", "", ""))
        if not stopped:
            stopped.append(("", "no pass left it without a gradient" if self.lens.passes else "no pass was recorded",
                            ""))
        path_set = safe_paths_to(self.lens.passes, self.name)
        paths = [(_route(path), _factors(path), _value(path.contribution)) for path in path_set.paths]
        if path_set.unknown:
            paths.append(("unknown", "", path_set.unknown))
        else:
            paths.append((f"sum over {path_set.count} path{'s' if path_set.count != 1 else ''}", "",
                          _value(path_set.total)))
        return {"stopped": stopped, "nonfinite": nonfinite, "paths": paths, "hooks": path_set.hooks,
                "seeded": path_set.seeded}

    def __repr__(self) -> str:
        try:
            rows = self.rows()
        except Exception as problem:  # a display never raises
            return f"why {self.name}: unknown ({type(problem).__name__}: {problem})"
        lines = [f"why {self.name}", "where the gradient stopped:"]
        lines += [f"  pass {row[0]}: {row[1]}: {row[2]}" if row[0] else f"  {row[1]}" for row in rows["stopped"]]
        lines.append("where NaN or inf started:")
        for number, what, received, sent, where in rows["nonfinite"]:
            detail = f": received {received}, passed on {sent}" if received else ""
            lines.append((f"  pass {number}: " if number else "  ") + f"{what}{detail}" + (f" ({where})" if where else ""))
        lines.append("which paths it took:")
        for route, factors, value in rows["paths"]:
            if route == "unknown":
                lines.append(f"  paths to {self.name}: unknown ({value})")
            else:
                lines.append(f"  {route}: " + (f"{factors} = " if factors else "") + value)
        if rows["hooks"]:
            lines.append(f"  {rows['hooks']}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        try:
            rows = self.rows()
        except Exception as problem:  # a display never raises
            return f"<p>why {html.escape(self.name)}: unknown ({html.escape(type(problem).__name__)})</p>"
        numbered = [(str(number), *row) if number <= len(rows["paths"]) - 1 and row[0] != "unknown" else ("", *row)
                    for number, row in enumerate(rows["paths"], 1)]
        # local derivatives are numbers only along paths of one-element tensors: say so instead of a blank column
        factored = any(row[2] for row in numbered)
        if factored:
            numbered = [(n, r, f or _no_factors(n, r, numbered), v) for n, r, f, v in numbered]
        else:
            numbered = [(n, r, v) for n, r, f, v in numbered]
        factors_note = "" if factored or not numbered[:-1] else \
            "; local derivatives are listed as numbers only for paths of one-element tensors, these are tensors"
        from .drawing import paths_drawing

        parts = [f"<h4>Why {html.escape(self.name)}</h4>",
                 "<p><b>Where the gradient stopped</b></p>",
                 _table(("pass", "reason", "evidence"), rows["stopped"]),
                 "<p><b>Where NaN or inf started</b></p>",
                 _table(("pass", "first step", "received", "passed on", "line"), rows["nonfinite"]),
                 f"<p><b>Which paths it took</b> (the chain rule without hooks{factors_note})</p>",
                 _table(("path", "from the root", *((FACTORS[rows.get("seeded", False)],) if factored else ()),
                         "contribution"),
                        numbered),
                 f"<p>{html.escape(rows['hooks'])}</p>" if rows["hooks"] else "",
                 paths_drawing(self.lens.passes, self.name)]
        return "".join(parts)


# the factors column: the gradient given to the root comes first when it is not 1 (backward(gradient=2.))
FACTORS = {False: "local derivatives", True: "root gradient × local derivatives"}


def _no_factors(number: str, route: str, rows: list[tuple[str, ...]]) -> str:
    """The local-derivatives cell of a row that lists none: a path of tensors, the paths summed into one row, or
    the sum, which adds the contributions (written out when every path is of one-element tensors)."""
    if route.startswith("the other "):
        return "not listed: their contributions summed in one row"
    if number:
        return "tensors: not single numbers"
    if not route.startswith("sum over"):
        return ""
    paths = [row for row in rows if row[0]]
    if all(factors or route.startswith("the other ") for _, route, factors, _ in paths):
        return "add the contributions: " + " + ".join(value for *_, value in paths)
    return "no product: the contributions above, added"


def _table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    header = "".join(f"<th>{html.escape(cell)}</th>" for cell in head)
    body = "".join(_row(row, len(head)) for row in rows)
    return f"<table><tr>{header}</tr>{body}</table>"


def _row(row: tuple[str, ...], width: int) -> str:
    """A row; one that only says something ("no pass left it without a gradient") spans the whole table."""
    if not row[0] and all(not cell for cell in row[2:]):
        return f'<tr><td colspan="{width}">{html.escape(row[1])}</td></tr>'
    return "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"


def _route(path: Any) -> str:
    return f"the other {path.rest} paths" if path.rest else " ← ".join(path.nodes)


def _factors(path: Any) -> str:
    from ..format import format_number

    return " × ".join(format_number(factor) for factor in path.factors)


def _value(value: Any) -> str:
    from ..format import format_value

    return format_value(value, 60) if value is not None else "unknown"
