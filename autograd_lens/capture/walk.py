"""Walk the real autograd graph (``grad_fn`` → ``next_functions``) into a :class:`Graph`.

The walk is iterative (a 1000-layer network must not hit Python's recursion
limit) and numbers nodes in the order it meets them, so the same code always
gives the same ids.  Besides the graph it returns an index from torch's node
objects to the drawing's ids, which the backward tracer uses to place each
gradient on its arrow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..model import Graph, GraphOptions, Value
from .names import Names, _hook_badges
from .rows import _NODE_NAMES, NODE_FIELDS, GraphRows, _arrows, _names_up_to
from .saved import _add_constants, _drawn_saved_values, _saved_summary, _storage_names
from .snapshot import _small, leaf_state  # noqa: F401  (leaf_state: re-exported, the tracer's)
from .structure import _REDUCING, Structure, _leaf_uses, _may_reduce, _output_shape, _reduced_dims, _uses_of
from .structure import _within_budget, structure

_BACKWARD_SUFFIX = re.compile(r"Backward\d*$")


def op_label(name: str) -> str:
    """A readable op for a backward function name.

    >>> op_label("MulBackward0"), op_label("AddmmBackward0"), op_label("torch::autograd::CopySlices")
    ('mul', 'addmm', 'copyslices')
    """
    label = _OP_LABELS.get(name)
    if label is None:
        if name == "BackwardHookFunctionBackward":
            label = "module hook boundary"
        else:
            short = name.rsplit("::", 1)[-1]
            label = (_BACKWARD_SUFFIX.sub("", short) or short).lower()
        if len(_OP_LABELS) < 4096:  # one entry per backward function type seen
            _OP_LABELS[name] = label
    return label


_OP_LABELS: dict[str, str] = {}
# The walk's shortcuts for the usual case (a leaf drawn once, a function with one unnamed output): off, it goes
# the general way; tests/test_perf_build.py checks that both draw the same.
_SHORTCUTS = True


@dataclass
class Walk:
    """A graph plus the index the tracer needs to map torch's nodes onto it.

    ``function_ids`` maps ``id(grad_fn)`` to the function node drawn for it (for
    ``AccumulateGrad``: the leaf tensor node); ``edge_rows`` maps
    ``id(grad_fn)`` to the arrows carrying the gradients it sends to its
    inputs, by input slot (``input_edges``: the same by ``(id(grad_fn), j)``);
    ``output_edges`` maps ``(id(grad_fn), k)`` to the arrow from
    the function to the tensor node of its k-th output; ``tensor_ids`` maps
    ``(id(grad_fn), k)`` to the tensor node of that output.
    """

    rows: GraphRows  # the graph's boxes and arrows, made into the Graph when first read (``graph``)
    structure: Structure
    function_ids: dict[int, str] = field(default_factory=dict)
    output_edges: dict[tuple[int, int], str] = field(default_factory=dict)
    tensor_ids: dict[tuple[int, int], str] = field(default_factory=dict)
    labels: dict[int, str] = field(default_factory=dict)  # id(grad_fn) -> label
    tensor_labels: dict[tuple[int, int], str] = field(default_factory=dict)  # as tensor_ids, the node's label
    # id(grad_fn) -> the arrows carrying the gradients it sends, by input slot (None where none is drawn)
    edge_rows: dict[int, tuple] = field(default_factory=dict)
    # id(grad_fn) of the drawn functions whose output_label is their entry in ``labels`` unless a tensor label
    # names that output (every drawn function but torch's module-hook boundaries)
    plain: set[int] = field(default_factory=set)
    op_names: dict[int, str] = field(default_factory=dict)  # id(grad_fn) -> its name(), for the drawn functions

    @property
    def graph(self) -> Graph:
        return self.rows.graph()

    @graph.setter
    def graph(self, graph: Graph) -> None:
        self.rows.set_graph(graph)

    @property
    def input_edges(self) -> dict[tuple[int, int], str]:
        """``(id(grad_fn), j)`` -> the arrow carrying the gradient it sends to its j-th input (from ``edge_rows``)."""
        return {(fn_id, slot): edge_id for fn_id, row in self.edge_rows.items() for slot, edge_id in enumerate(row)
                if edge_id is not None}

    @property
    def leaf_names(self) -> dict[int, str]:
        return self.structure.leaf_labels

    @property
    def all_nodes(self) -> list[Any]:
        return self.structure.nodes

    @property
    def consumers(self) -> dict[tuple[int, int], list[tuple[Any, int]]]:
        return self.structure.consumers

    @property
    def root_edges(self) -> list[tuple[Any, int]]:
        return self.structure.root_edges

    @property
    def root_labels(self) -> list[str]:
        return self.structure.root_labels

    def target_labels(self, following: tuple) -> tuple:
        """``output_label`` of each ``(fn, output_nr)`` of a node's ``next_functions`` ("(no grad needed)" for
        None): the same, without a call and a ``name()`` read per arrow for the drawn functions."""
        tensor_labels, labels, plain, output_label = self.tensor_labels, self.labels, self.plain, self.output_label
        targets = []
        for next_fn, output_nr in following:
            if next_fn is None:
                targets.append("(no grad needed)")
                continue
            key = id(next_fn)
            label = tensor_labels.get((key, output_nr))
            if label is None:
                label = labels[key] if key in plain else output_label(next_fn, output_nr)
            targets.append(label)
        return tuple(targets)

    def output_label(self, fn: Any, output_nr: int) -> str:
        """What a student calls output ``output_nr`` of ``fn``: its tensor's name, or the op."""
        label = self.tensor_labels.get((id(fn), output_nr))
        if label is not None:
            return label
        name = fn.name()
        if name == "BackwardHookFunctionBackward":
            # torch's boundary for a module's full backward hook passes its k-th input through as its k-th
            # output: the tensor is the one that went in
            try:
                inner, inner_nr = fn.next_functions[output_nr]
            except (IndexError, RuntimeError):
                inner = None
            if inner is not None:
                return self.output_label(inner, inner_nr)
        label = name if self.labels.get(id(fn)) is None else self.labels[id(fn)]
        try:  # one of several outputs with no box of its own (nothing used it): which one, as the boxes say it
            several = len(fn._input_metadata) > 1
        except Exception:  # noqa: BLE001  (a node without metadata: one output)
            several = False
        return f"{label}[{output_nr}]" if several else label


class _Builder(GraphRows):
    """Numbers nodes and edges in the order they are added (as rows: see ``rows.GraphRows``); the ``saves ...``
    details holding numbers (``saved.SavedText``) are written when the Graph is made, after the pass."""

    def __init__(self, options: GraphOptions) -> None:
        super().__init__(options)
        self.later: list[int] = []  # indexes of the rows whose detail is a SavedText

    def graph(self) -> Graph:
        if self._graph is not None:
            return self._graph
        if self.later:
            nodes, detail = self.nodes, _DETAIL
            for index in self.later:  # (plain Python numbers: no tensor op runs)
                row = nodes[index]
                nodes[index] = row[:detail] + (row[detail].text(),) + row[detail + 1:]
            self.later = []
        return super().graph()


_DETAIL = NODE_FIELDS.index("detail")




def walk(
    roots: Sequence[Any] | Structure,
    names: Names,
    options: GraphOptions,
    root_names: Sequence[str | None] | None = None,
    leaf_state: dict[int, tuple[Value, Value]] | None = None,
) -> Walk:
    """Build the model of the graph behind ``roots`` (tensors, ``GradientEdge``s or a :class:`Structure`).

    ``leaf_state`` (``id(AccumulateGrad)`` → (value, grad)) replaces the leaves'
    current values: the tracer reads them before a pass and builds the model after.
    """
    if isinstance(roots, Structure):
        shape = roots
    else:
        shape = structure(roots)
        shape.label(names, root_names)
    reachable = shape.nodes
    nexts = shape.edges()  # each node's next_functions, read once
    leaf_labels = shape.leaf_labels
    # id(AccumulateGrad) -> uses by the functions drawn (from the users, when made: the same count)
    uses = _leaf_uses(nexts, leaf_labels) if shape._consumers is None or not _SHORTCUTS \
        else _uses_of(shape._consumers, leaf_labels)
    if len(reachable) - len(leaf_labels) + sum(uses.values()) <= options.max_nodes:
        count = len(reachable)  # every box fits (what _within_budget would find, without going through them)
    else:
        count = _within_budget(reachable, shape, options.max_nodes, nexts)
        uses = _leaf_uses(nexts[:count], leaf_labels)
    kept = reachable[:count]
    all_kept = count == len(reachable)  # every input of a kept function is kept (the usual case)
    kept_ids = None if all_kept else {id(fn) for fn in kept}
    build = _Builder(options)
    node, nodes, later = build.node, build.nodes, build.later
    result = Walk(rows=build, structure=shape)
    function_ids, labels = result.function_ids, result.labels
    tensor_ids, tensor_labels, output_edges = result.tensor_ids, result.tensor_labels, result.output_edges
    plain_add, op_names = result.plain.add, result.op_names
    max_elements = options.max_elements
    # Summaries of large tensors cost a few reductions each: only for graphs a student reads.
    stats = len(reachable) <= 200
    tensors_by_node: dict | None = None  # (id(grad_fn), output_nr) -> the named tensor: made when a tensor box needs it
    root_label = {(id(fn), nr): label for (fn, nr), label in zip(shape.root_edges, shape.root_labels)}
    storage_names = _storage_names(names) if options.show_saved else {}
    module_badges = names.module_badges()
    user_names = set(names.tensors.values())
    outputs_named = names.outputs
    split = options.split_leaf_uses
    show_saved = options.show_saved

    shortcuts = _SHORTCUTS
    leaf_copies: dict[int, list[str]] = {}
    # id(fn) -> the box its arrows start at, for a leaf drawn once and a function with no tensor box (the usual case)
    sources: dict[int, str] = {}
    op_labels, reducing = _OP_LABELS, _REDUCING
    node_names = _names_up_to(2 * len(kept) + 8, _NODE_NAMES, "n")
    named_count = len(node_names)
    leaf_type = leaf_name = None  # torch's AccumulateGrad type and its name() (the same for every node of the type)
    for fn in kept:
        fn_key = id(fn)
        label = leaf_labels.get(fn_key)
        if label is not None:
            if type(fn) is not leaf_type:
                leaf_type, leaf_name = type(fn), fn.name()
            name = leaf_name
            variable = fn.variable
            count_uses = uses.get(fn_key, 0)
            copies = count_uses if count_uses > split else 1
            shape_now = tuple(variable.shape)
            if leaf_state is not None:
                value, grad = leaf_state[fn_key]
                if value is None:
                    if not stats and variable.numel() > max_elements:  # as _small(...), without the call:
                        value = (shape_now, variable.dtype)  # the summary's (shape, dtype), made with the Graph
                    else:
                        value = _small(variable, options, stats, shape_now)
            else:
                value, grad = _small(variable, options, stats, shape_now), _small(variable.grad, options, stats)
            kind = "output" if (fn_key, 0) in root_label else "leaf"
            badges = _hook_badges(variable)
            if module_badges:
                badges += module_badges.get(id(variable), ())
            if copies == 1 and shortcuts:  # the usual case: one box (as node(...), without the call)
                count_nodes = len(nodes)
                node_id = node_names[count_nodes] if count_nodes < named_count else f"n{count_nodes}"
                # a row: id, kind, label, op, shape, value, grad, hooks, detail, sequence_nr, reduced
                nodes.append((node_id, kind, label, name, shape_now, value, grad, badges, "", None, None))
                ids = [node_id]
                sources[fn_key] = node_id
            else:
                ids = [node(kind=kind, label=label, op=name, shape=shape_now, value=value, grad=grad, hooks=badges,
                            sequence_nr=None, detail=f"use {copy + 1} of {copies}" if copies > 1 else "")
                       for copy in range(copies)]
            leaf_copies[fn_key] = ids
            function_ids[fn_key] = ids[0]
            labels[fn_key] = label
            tensor_ids[(fn_key, 0)] = ids[0]
            tensor_labels[(fn_key, 0)] = label
            continue
        name = fn.name()
        named_output = outputs_named.get((fn_key, 0)) if outputs_named else None
        label = op_labels.get(name) or op_label(name)
        if label in user_names:  # the user has a tensor of that name (a target ``t``): not this op, say it's a call
            label += "()"
        try:  # _metadata(fn) and _output_shape(metadata, 0), without the calls
            metadata = fn._input_metadata  # (a tuple, built anew at each read)
            if type(metadata) is not tuple:
                metadata = tuple(metadata or ())
        except (AttributeError, RuntimeError, TypeError):
            metadata = ()
        try:
            shape_now = tuple(metadata[0].shape) if metadata else None
        except (AttributeError, IndexError, RuntimeError, TypeError):
            shape_now = None
        reduces = reducing.get(type(fn))
        if reduces is None:
            reduces = _may_reduce(type(fn))
        count_nodes = len(nodes)
        if show_saved:
            saved = _drawn_saved_values(fn)  # read once: the summary and the constants
            detail = _saved_summary(fn, names, storage_names, options, saved, later=True)
            if type(detail) is not str:  # numbers written when the Graph is made (_Builder.graph)
                later.append(count_nodes)
        else:
            detail = ""
        node_id = node_names[count_nodes] if count_nodes < named_count else f"n{count_nodes}"
        # as node(kind="function", ...), without the call: a row in Node's field order
        nodes.append((node_id, "function", label, name, shape_now, None, None, (), detail,
                      fn._sequence_nr(), _reduced_dims(fn) if reduces else None))
        function_ids[fn_key] = node_id
        labels[fn_key] = label if named_output is None else f"{label} → {named_output}"
        op_names[fn_key] = name
        if name != "BackwardHookFunctionBackward":
            plain_add(fn_key)
        # A tensor node for every output that has a name, is a root, or is one of several outputs.
        outputs = len(metadata) or 1
        if shortcuts and outputs == 1 and named_output is None and (fn_key, 0) not in root_label:
            sources[fn_key] = node_id  # its arrows start at its box
            if show_saved:
                _add_constants(build, saved, node_id)
            continue  # the usual case: no tensor box (what the loop below finds)
        for output_nr in range(outputs):
            key = (fn_key, output_nr)
            tensor_label = root_label.get(key) or outputs_named.get(key)
            if tensor_label is None and outputs > 1 and key in result.consumers:
                tensor_label = f"{label}[{output_nr}]"
            if tensor_label is None:
                continue
            if tensors_by_node is None:
                tensors_by_node = names.results()
            live = tensors_by_node.get(key)
            tensor_id = node(
                kind="output" if key in root_label else "tensor",
                label=tensor_label,
                shape=_output_shape(metadata, output_nr),
                value=_small(live, options, stats) if live is not None else None,
                grad=_small(live.grad, options, stats) if live is not None and live.retains_grad else None,
                hooks=_hook_badges(live) if live is not None else (),
            )
            tensor_ids[key] = tensor_id
            tensor_labels[key] = tensor_label
            output_edges[key] = build.edge(node_id, tensor_id)
        if show_saved:
            _add_constants(build, saved, node_id)

    # Arrows from each input (tensor node, or the function standing for an unnamed result) to its user.
    use_counter: dict[int, int] = {}
    edge_rows = result.edge_rows
    edges = build.edges
    if shortcuts and kept_ids is None:  # every input of a drawn function drawn: the usual case, in a loop of its own
        _arrows(kept, nexts, leaf_labels, function_ids, sources, edges, edge_rows, leaf_copies, use_counter,
                tensor_ids)
    for fn, following in zip(kept, nexts) if not shortcuts or kept_ids is not None else ():
        fn_key = id(fn)
        if fn_key in leaf_labels:
            continue
        dst = function_ids[fn_key]
        row: list[str | None] = []  # the arrow of each input slot, None where none is drawn
        for next_fn, output_nr in following:
            if next_fn is None:
                row.append(None)
                continue
            key = id(next_fn)
            if kept_ids is not None and key not in kept_ids:
                row.append(None)
                continue
            copies = leaf_copies.get(key)
            if copies is not None:
                if len(copies) == 1 and shortcuts:
                    src = copies[0]
                else:
                    index = use_counter.get(key, 0)
                    use_counter[key] = index + 1
                    src = copies[min(index, len(copies) - 1)]
            else:
                src = tensor_ids.get((key, output_nr)) or function_ids[key]
            edge_id = f"e{len(edges)}"  # as edge(src, dst), without the call
            edges.append((edge_id, src, dst, "data", ""))
            row.append(edge_id)
        edge_rows[fn_key] = tuple(row)

    hidden = len(reachable) - len(kept)
    if hidden:
        note = build.node(
            kind="hidden",
            label=f"{hidden} more backward functions not drawn",
            detail=f"pass max_nodes={len(reachable)} (or more) to draw all of them",
        )
        for fn, following in zip(kept, nexts):
            if any(n is not None and id(n) not in kept_ids for n, _ in following):
                build.edge(note, function_ids[id(fn)], kind="hidden")
    build.hidden = hidden  # the Graph is made from the rows when first read (Walk.graph)
    return result
