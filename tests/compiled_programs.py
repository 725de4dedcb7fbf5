"""Generated training programs where part of the model is ``torch.compile``'d: code this project did not write.

The twin of ``model_programs.py`` (whose models, hooks, training loop and comparison it reuses): after the model is
built, some of its top-level modules are compiled in place (``module.compile(backend=...)``, so their names stay
the same), with ``aot_eager`` (AOTAutograd's joint graph run by eager kernels: torch's ``CompiledFunctionBackward``
in the graph, no C++ compiler needed) or ``eager`` (dynamo alone).  Hooks registered inside a compiled forward are
traced into the compiled backward, where no hook call can be seen: there the lens must say *unknown*, never guess.
Every statement the lens makes is checked against torch, as in ``model_programs``.

``python tests/compiled_programs.py --programs 40 --seed 0`` runs a campaign (a few seconds per program: dynamo).
"""

from __future__ import annotations

import sys

import model_programs
from programs import Program

BACKENDS = ("aot_eager", "aot_eager", "eager")


class CompiledGenerator(model_programs.ModelGenerator):
    """``model_programs``' model with some top-level modules compiled in place."""

    def generate(self) -> Program:
        rng = self.rng
        self.kind = rng.choice(["seq", "seq", "conv", "mlp"])
        getattr(self, f"_{self.kind}")()
        self.lines.insert(0, "torch._dynamo.reset()")  # each program compiles afresh (no cache from the last one)
        # a compiled backward with donated buffers refuses retain_graph=True: the checker's run with the hooks
        # switched off needs it (the lens itself was checked with them: the same error both ways)
        self.lines.insert(1, "torch._functorch.config.donated_buffer = False")
        chosen = [top for top in self.tops if rng.random() < 0.6] or [rng.choice(self.tops)]
        backend = rng.choice(BACKENDS)
        self.lines += [f"{top}.compile(backend={backend!r})" for top in chosen]
        self.lines.append(f"model = nn.ModuleList([{', '.join(self.tops)}])")
        self._names()
        for _ in range(rng.choice([0, 1, 2, 3, 4])):
            self.hook()
        self.train()
        return Program(self.lines, self.params + [f"x{k}" for k in range(8)] if self.inputs_leaf else self.params,
                       self.seed)


def check(seed: int, cross_check: bool = False) -> tuple[Program, list[str]]:
    return model_programs.check(seed, cross_check, CompiledGenerator)


def main(argv: list[str] | None = None) -> int:
    return model_programs.main(argv, CompiledGenerator, __doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
