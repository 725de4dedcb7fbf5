"""The modules a first picture imports after ``import autograd_lens`` make no dataclass (issue #22: each one is
methods written and compiled at import, on the picture's path in a one-cell notebook); their small classes behave as
the frozen dataclasses they were (``views.frozen``).  Counted, never timed."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from autograd_lens.views.fold import Fold, Folded
from autograd_lens.views.frozen import Frozen
from autograd_lens.views.gradsize import SizeBin, Sizes

# what a first picture imports after ``import autograd_lens`` (the navigator and the in-process layout included)
PICTURE_MODULES = ("fold", "gradsize", "groups", "svgslim", "pagecss", "static_html", "graphview", "wasmfast",
                   "display", "render", "dot", "dotwriter")


def test_a_first_pictures_modules_make_no_dataclass_at_import():
    code = ("import dataclasses, importlib, autograd_lens\n"
            "made = []\n"
            "process = dataclasses._process_class\n"
            "def counted(cls, *args, **kwargs):\n"
            "    made.append(cls.__qualname__)\n"
            "    return process(cls, *args, **kwargs)\n"
            "dataclasses._process_class = counted\n"
            f"for name in {PICTURE_MODULES!r}:\n"
            "    importlib.import_module('autograd_lens.views.' + name)\n"
            "print(made)\n")
    made = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert made == "[]", made


@dataclasses.dataclass(frozen=True)
class _FoldAsDataclass:
    id: str
    label: str
    kind: str
    paths: tuple
    nodes: tuple
    functions: int
    hooks: int = 0
    in_all: int = 0


def test_a_fold_behaves_as_the_frozen_dataclass_it_was():
    values = ("f1", "layers.0-1 (x2)", "Block", ("layers.0", "layers.1"), ("n1", "n2"), 3)
    made = [Fold(*values), Fold(*values[:3], nodes=values[4], paths=values[3], functions=3), Fold(*values, 0)]
    reference = _FoldAsDataclass(*values)
    for fold in made:
        assert fold == made[0] and hash(fold) == hash(reference) and fold.hooks == 0
        assert repr(fold) == repr(reference).replace("_FoldAsDataclass", "Fold")
        assert fold != reference and fold != Fold(*values, 1) and (fold == values) is False
    assert {made[0]: 1}[made[1]] == 1 and made[0].detail() == "Block · 3 backward functions each"
    with pytest.raises(dataclasses.FrozenInstanceError):
        made[0].hooks = 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        del made[0].label
    for arguments, named in ((values[:5], {}), (values + (0, 1, 2), {}), (values, {"color": 1}), (values, {"id": "f2"})):
        with pytest.raises(TypeError):
            Fold(*arguments, **named)


def test_the_other_classes_are_compared_and_shown_by_their_fields():
    bin_ = SizeBin(0.1, 1.0, "#93c5fd", "1")
    assert bin_ == SizeBin(low=0.1, high=1.0, color="#93c5fd", width="1") != SizeBin(0.1, 2.0, "#93c5fd", "1")
    assert repr(bin_) == "SizeBin(low=0.1, high=1.0, color='#93c5fd', width='1')" and bin_.text.startswith("grad norm")
    sizes = Sizes(None, {}, {}, [bin_])
    assert sizes == Sizes(None, {}, {}, [bin_]) and sizes.bins == [bin_]
    with pytest.raises(TypeError):  # a dict among its fields, as the dataclass: unhashable
        hash(sizes)
    assert Folded(None, (), ()) == Folded(None, (), ()) and Folded(None, (), ()).folds == ()
    assert all(issubclass(cls, Frozen) and not dataclasses.is_dataclass(cls) for cls in (Fold, Folded, SizeBin, Sizes))
