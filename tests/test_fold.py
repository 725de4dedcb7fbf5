"""Folding: runs of identical blocks drawn as one box, on a 12-layer transformer and a ResNet built here."""

from __future__ import annotations

import html
import re

import pytest
import torch
from torch import nn

import autograd_lens as al
from autograd_lens.views.fold import fold, fold_label, groups_from_parameters, plan


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        q, k, v = self.attn(self.ln1(x)).chunk(3, -1)
        x = x + self.proj(torch.softmax(q @ k.transpose(-1, -2) / 4, -1) @ v)
        return x + self.out(torch.relu(self.fc(self.ln2(x))))


class Transformer(nn.Module):
    def __init__(self, width: int = 8, depth: int = 12) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, width)
        self.layers = nn.ModuleList([Block(width) for _ in range(depth)])
        self.head = nn.Linear(width, 10)

    def forward(self, tokens):
        x = self.emb(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class BasicBlock(nn.Module):
    def __init__(self, channels_in: int, channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample = None
        if stride != 1 or channels_in != channels:
            self.downsample = nn.Sequential(nn.Conv2d(channels_in, channels, 1, stride, bias=False),
                                            nn.BatchNorm2d(channels))

    def forward(self, x):
        out = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(out + (self.downsample(x) if self.downsample is not None else x))


class ResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.layer1 = nn.Sequential(*[BasicBlock(4, 4) for _ in range(3)])
        self.layer2 = nn.Sequential(BasicBlock(4, 8, 2), BasicBlock(8, 8), BasicBlock(8, 8))
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        x = self.layer2(self.layer1(torch.relu(self.stem(x))))
        return self.fc(x.mean((2, 3)))


def transformer_loss(depth=12):
    torch.manual_seed(0)
    model = Transformer(depth=depth)
    return model, model(torch.randint(0, 10, (2, 5))).logsumexp(-1).mean()


def resnet_loss():
    torch.manual_seed(0)
    model = ResNet()
    return model, model(torch.randn(2, 3, 8, 8)).sum()


def functions(graph):
    return [node for node in graph.nodes if node.kind == "function"]


def test_a_12_layer_transformer_is_drawn_as_one_box_for_its_layers():
    model, loss = transformer_loss()
    graph = al.graph(loss, names={"model": model})
    assert graph.hidden_nodes == 0 and len(functions(graph)) > 300  # walked whole: the folded drawing is small
    drawn = plan(graph)
    assert [f.label for f in drawn.folds] == ["layers.0-11 (x12)"]
    box = drawn.folds[0]
    assert box.kind == "Block" and box.paths == tuple(f"model.layers.{i}" for i in range(12))
    # every parameter of every layer is inside the box, and nothing of the embedding or the head
    labels = {graph.node(n).label for n in box.nodes}
    layer_parameters = {f"model.{name}" for name, _ in model.named_parameters() if name.startswith("layers.")}
    assert layer_parameters <= labels
    assert not any(label.startswith(("model.emb", "model.head")) for label in labels)
    # a layer's functions: what one block does in plain PyTorch, counted from a forward of Block alone
    torch.manual_seed(0)
    one = Block(8)(torch.randn(2, 5, 8, requires_grad=True)).sum()
    alone = al.graph(one, names={}, fold=False)
    block_functions = len(functions(alone)) - 1  # less the final sum
    # the out projection's reshape back to 3-d and the last residual add come after the block's last parameter:
    # drawn outside each block, between them, and after the last one (outside the box)
    assert box.functions == block_functions - 2
    folded_functions = [n for n in box.nodes if graph.node(n).kind == "function"]
    assert len(folded_functions) == 12 * block_functions - 2
    # the drawing: the box once, joined to the embedding before it and the add after it
    folded = drawn.graph
    assert len(folded.nodes) < 25 and folded.node("f1").kind == "folded"
    into = {folded.node(e.src).label for e in folded.edges_into("f1")}
    out_of = {folded.node(e.dst).op for e in folded.edges_from("f1")}
    assert into == {"embedding"} and out_of == {"AddBackward0", "ViewBackward0"}
    assert folded.node("n1").kind == "output"  # the root stays drawn
    # every arrow of the graph is in the drawing, or inside the box
    ends = {(e.src, e.dst) for e in folded.edges}
    owner = {n: "f1" for n in box.nodes}
    for edge in graph.edges:
        src, dst = owner.get(edge.src, edge.src), owner.get(edge.dst, edge.dst)
        assert src == dst == "f1" or (src, dst) in ends


def test_the_box_label_is_in_the_dot_and_the_svg_and_deterministic():
    model, loss = transformer_loss()
    dot = al.graph(loss, names={"model": model}).to_dot()
    assert 'label="layers.0-11 (x12)\\nBlock · 442 backward functions in all"' in dot and "box3d" in dot
    assert "subgraph cluster_m1" in dot  # the modules outlined
    assert al.graph(loss, names={"model": model}).to_dot() == dot
    svg = html.unescape(al.graph(loss, names={"model": model}).render().decode())
    assert "layers.0-11 (x12)" in svg and svg.count('class="node"') < 25


def test_expand_draws_one_layer_in_full():
    model, loss = transformer_loss()
    graph = al.graph(loss, names={"model": model}, expand="layers.3")
    drawn = plan(graph)
    assert [f.label for f in drawn.folds] == ["layers.0-2 (x3)", "layers.4-11 (x8)"]
    labels = {node.label for node in drawn.graph.nodes}
    assert {"model.layers.3.fc.weight", "model.layers.3.attn.bias"} <= labels
    assert "model.layers.2.fc.weight" not in labels and "model.layers.4.fc.weight" not in labels
    assert any(g.path == "model.layers.3" for g in drawn.groups)  # its outline
    assert plan(al.graph(loss, names={"model": model}, expand=["all"])).folds == ()
    unfolded = al.graph(loss, names={"model": model}, fold=False)
    assert "box3d" not in unfolded.to_dot() and unfolded.hidden_nodes > 0  # as before: cut at max_nodes


def test_groups_found_from_parameters_agree_with_the_recorded_module_calls():
    """graph() sees no forward: its groups come from the parameters' names.  Against Lens(modules=True), which
    records each call: every function the inferred groups put in a module was made inside that module's call
    (a layer's own ops before its first parameter are drawn in the module around it: a lower bound)."""
    model, _ = transformer_loss(depth=3)
    with al.Lens(names={"model": model}, modules=True) as lens:
        model(torch.randint(0, 10, (2, 5))).logsumexp(-1).mean().backward()
    recorded = lens.passes[0]
    graph = recorded.graph
    kinds = {name or "model": type(m).__name__ for name, m in model.named_modules(prefix="model")}
    inferred = groups_from_parameters(graph, kinds)
    compared = exact = 0
    for group in inferred:
        for node_id in group.nodes:
            if graph.node(node_id).kind == "function":
                made_by = recorded.group_of(node_id)
                assert made_by is not None and (made_by.path + ".").startswith(group.path + "."), \
                    (graph.node(node_id), group.path)
                compared += 1
                exact += made_by.path == group.path
    assert compared > 60 and exact > compared * 3 // 4  # most are the very module
    # the recorded calls fold the same way
    folded = fold(graph, recorded.groups)
    assert [f.label for f in folded.folds] == ["layers.0-2 (x3)"]


def test_a_resnet_folds_its_identical_blocks_only():
    model, loss = resnet_loss()
    graph = al.graph(loss, names={"model": model})
    drawn = plan(graph)
    # layer1: three identical blocks; layer2: the first block downsamples (a different structure), the next two fold
    assert [f.label for f in drawn.folds] == ["layer1.0-2 (x3)", "layer2.1-2 (x2)"]
    assert [f.kind for f in drawn.folds] == ["BasicBlock", "BasicBlock"]
    labels = {node.label for node in drawn.graph.nodes}
    assert "model.layer2.0.downsample.0.weight" in labels and "model.stem.weight" in labels
    assert "model.layer1.1.conv1.weight" not in labels
    # Lens(modules=True) records the same blocks
    torch.manual_seed(0)
    with al.Lens(names={"model": model}, modules=True) as lens:
        model(torch.randn(2, 3, 8, 8)).sum().backward()
    assert [f.label for f in fold(lens.passes[0].graph, lens.passes[0].groups).folds] == \
        ["layer1.0-2 (x3)", "layer2.1-2 (x2)"]


def test_small_graphs_and_graphs_without_modules_are_not_folded():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2))
    loss = model(torch.randn(1, 2)).sum()
    graph = al.graph(loss, names={"model": model})
    assert len(graph.nodes) <= 60 and graph.to_dot() == al.graph(loss, names={"model": model}, fold=False).to_dot()
    _, loss = transformer_loss(depth=2)
    anonymous = al.graph(loss, names={})  # no module named: nothing to fold by
    assert "cluster" not in anonymous.to_dot()


def test_siblings_with_the_same_structure_but_other_names_are_not_folded():
    """attn and proj are both Linear: not a run of blocks (only numbered siblings or repeated calls fold)."""
    model, loss = transformer_loss(depth=2)
    labels = [f.label for f in plan(al.graph(loss, names={"model": model}, expand="all")).folds]
    assert labels == []
    assert fold_label(["m.blocks.4", "m.blocks.5"], "Block") == "blocks.4-5 (x2)"
    assert fold_label(["shared", "shared", "shared"], "Block") == "shared (x3 calls)"
    assert fold_label([None, None], "Linear") == "Linear (x2)"


@pytest.mark.parametrize("tied", [False, True])
def test_a_tied_weight_does_not_make_a_group_that_swallows_the_model(tied):
    model, _ = transformer_loss(depth=4)
    if tied:
        model.head.weight = model.emb.weight  # used at the start and at the end
    loss = model(torch.randint(0, 10, (2, 5))).logsumexp(-1).mean()
    drawn = plan(al.graph(loss, names={"model": model}))
    assert [f.label for f in drawn.folds] == ["layers.0-3 (x4)"]
    paths = [g.path for g in drawn.groups]
    assert ("model.emb" in paths) is not tied  # the tied weight's module spans the others: not outlined
    assert re.search(r"layers", " ".join(p for p in paths if p))


def test_gradient_sizes_module_norms_and_a_legend():
    """After backward: each module's outline says the norm of its parameters' gradients (as torch computes it),
    the folded box lists its blocks' norms, parameters are outlined by size step, and a legend says the steps."""
    from autograd_lens.numbers import format_number
    from autograd_lens.views.gradsize import SIZE_WIDTHS, size_bins

    model, loss = transformer_loss()
    loss.backward()
    again = model(torch.randint(0, 10, (2, 5))).logsumexp(-1).mean()  # drawn with the .grad the first pass left
    dot = al.graph(again, names={"model": model}).to_dot()

    def norm(prefix):
        return sum(float(p.grad.double().norm()) ** 2 for n, p in model.named_parameters(prefix="model")
                   if n.startswith(prefix + ".")) ** 0.5

    for path in ("model", "model.layers", "model.head", "model.emb"):
        assert f"{path} · " in dot and f"· grad norm {format_number(norm(path))}\"" in dot, path
    blocks = [norm(f"model.layers.{i}") for i in range(12)]
    assert (f"grad norm per block: {format_number(blocks[0])}, {format_number(blocks[1])} … {format_number(blocks[-1])} "
            f"(min {format_number(min(blocks))}, max {format_number(max(blocks))})") in dot
    drawn = {"model.emb.weight": norm("model.emb"), "model.head.weight": float(model.head.weight.grad.norm()),
             "model.head.bias": float(model.head.bias.grad.norm())}
    bins = size_bins(list(drawn.values()))
    assert len(bins) == 4 and 'label="outline: size of .grad"' in dot
    largest = max(drawn, key=drawn.get)
    line = next(line for line in dot.splitlines() if f'"{largest} [' in line or f"{largest} [" in line)
    assert f"penwidth={SIZE_WIDTHS[-1]}" in line
    # before any backward nothing is known: no sizes, no legend
    model, loss = transformer_loss()
    assert "grad norm" not in al.graph(loss, names={"model": model}).to_dot()


def test_the_drawings_with_folds_opened_share_the_graphs_lookups_and_arrows():
    """Each drawing with a fold opened is planned from the same groups and lookups as the graph, and keeps the
    graph's own arrows where they are drawn as they are: a first picture stores several such drawings, and every
    object they keep brings the interpreter's next full garbage collection (0.1 s over torch's heap) nearer."""
    from autograd_lens.views.fold import expanded, fold_states

    model, loss = transformer_loss()
    graph = al.graph(loss, names={"model": model})
    states = fold_states(graph)
    assert len(states) == 3
    originals = {edge.id: edge for edge in graph.edges}
    for state, folded in states[1:]:
        drawn = expanded(graph, state)
        assert drawn._index is graph._index and drawn.nodes is graph.nodes and drawn.edges is graph.edges
        kept = [edge for edge in folded.graph.edges if edge.id in originals and edge == originals[edge.id]]
        assert kept and all(edge is originals[edge.id] for edge in kept)
        merged = [edge for edge in folded.graph.edges if edge not in kept]
        assert merged and all(edge.src.startswith("f") or edge.dst.startswith("f") for edge in merged)
        # the same drawing as planned from scratch
        alone = fold(drawn, groups_from_parameters(graph, dict(graph.modules)), drawn.options.expand)
        assert alone == folded
