"""The chain rule of each backward function a course meets first, as data: what each input receives from ``g``,
in words, and which family of ops it belongs to (elementwise, shape, reduction …).  :mod:`.chain` applies them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    """How one backward function turns ``g`` (its output's gradient) into what each input receives.

    ``args``: torch's argument name of each input slot; ``expression``: the forward op; ``local``: per slot,
    the local derivative (``elementwise``) or what the input receives (``product``, ``shape``)."""

    args: tuple[str, ...]
    expression: str
    local: tuple[str, ...]
    family: str = "elementwise"  # "elementwise", "product", "reduction", "shape", "identity"


_E = "elementwise"
_VIEW = Rule(("self",), "{out} = {self} reshaped to {out_shape}", ("g reshaped back to {in_shape}",), "shape")
_SQUEEZE = Rule(("self",), "{out} = {self} with a size-1 dim removed or added ({in_shape} → {out_shape})",
                ("g reshaped back to {in_shape}",), "shape")
RULES: dict[str, Rule] = {
    "AddBackward0": Rule(("self", "other"), "{out} = {self} + {alpha_}{other}", ("1", "{alpha}")),
    "AddBackward1": Rule(("self",), "{out} = {self} + {alpha_}{other}", ("1",)),
    "SubBackward0": Rule(("self", "other"), "{out} = {self} - {alpha_}{other}", ("1", "{neg_alpha}")),
    "SubBackward1": Rule(("self",), "{out} = {self} - {alpha_}{other}", ("1",)),
    "RsubBackward0": Rule(("self", "other"), "{out} = {other} - {alpha_}{self}", ("{neg_alpha}", "1")),
    "RsubBackward1": Rule(("self",), "{out} = {other} - {alpha_}{self}", ("{neg_alpha}",)),
    "MulBackward0": Rule(("self", "other"), "{out} = {self} * {other}", ("{other}", "{self}")),
    "MulBackward1": Rule(("self",), "{out} = {self} * {other}", ("{other}",)),
    "DivBackward0": Rule(("self", "other"), "{out} = {self} / {other}", ("1/{other}", "-{self}/{other}²")),
    "DivBackward1": Rule(("self",), "{out} = {self} / {other}", ("1/{other}",)),
    "PowBackward0": Rule(("self",), "{out} = {self} ** {exponent}", ("{exponent}·{self}^({exponent}-1)",)),
    "PowBackward1": Rule(("self", "exponent"), "{out} = {self} ** {exponent}",
                         ("{exponent}·{self}^({exponent}-1)", "{out}·ln({self})")),
    "PowBackward2": Rule(("exponent",), "{out} = {self} ** {exponent}", ("{out}·ln({self})",)),
    "ExpBackward0": Rule(("self",), "{out} = exp({self})", ("exp({self}) = {out}",)),
    "LogBackward0": Rule(("self",), "{out} = log({self})", ("1/{self}",)),
    "SqrtBackward0": Rule(("self",), "{out} = sqrt({self})", ("1/(2·sqrt({self})) = 1/(2·{out})",)),
    "SinBackward0": Rule(("self",), "{out} = sin({self})", ("cos({self})",)),
    "CosBackward0": Rule(("self",), "{out} = cos({self})", ("-sin({self})",)),
    "TanhBackward0": Rule(("self",), "{out} = tanh({self})", ("1 - tanh({self})² = 1 - {out}²",)),
    "SigmoidBackward0": Rule(("self",), "{out} = sigmoid({self})", ("σ({self})·(1 - σ({self}))",)),
    "ReluBackward0": Rule(("self",), "{out} = relu({self})", ("1 where {self} > 0, else 0",)),
    "NegBackward0": Rule(("self",), "{out} = -{self}", ("-1",)),
    "DotBackward0": Rule(("self", "tensor"), "{out} = {self} · {tensor}", ("{tensor}", "{self}")),
    "SumBackward0": Rule(("self",), "{out} = {self}.sum()", ("1",), "reduction"),
    "SumBackward1": Rule(("self",), "{out} = {self}.sum({dims})", ("1",), "reduction"),
    "MeanBackward0": Rule(("self",), "{out} = {self}.mean()", ("1/n",), "reduction"),
    "MeanBackward1": Rule(("self",), "{out} = {self}.mean({dims})", ("1/n",), "reduction"),
    # matrix products: what each input receives is a vector–Jacobian product, g times the local
    # derivative, computed without ever building the Jacobian
    "MmBackward0": Rule(("self", "mat2"), "{out} = {self} @ {mat2}", ("g @ {mat2}ᵀ", "{self}ᵀ @ g"), "product"),
    "BmmBackward0": Rule(("self", "mat2"), "{out} = {self} @ {mat2} (a batch of matrix products)",
                         ("g @ {mat2}ᵀ, batch by batch", "{self}ᵀ @ g, batch by batch"), "product"),
    "MvBackward0": Rule(("self", "vec"), "{out} = {self} @ {vec}",
                        ("g ⊗ {vec} (the outer product g·{vec}ᵀ)", "{self}ᵀ @ g"), "product"),
    "AddmmBackward0": Rule(("self", "mat1", "mat2"), "{out} = {beta_}{self} + {alpha_}{mat1} @ {mat2}",
                           ("{beta_}g", "{alpha_}g @ {mat2}ᵀ", "{alpha_}{mat1}ᵀ @ g"), "product"),
    "AddmvBackward0": Rule(("self", "mat", "vec"), "{out} = {beta_}{self} + {alpha_}{mat} @ {vec}",
                           ("{beta_}g", "{alpha_}g ⊗ {vec} (the outer product g·{vec}ᵀ)", "{alpha_}{mat}ᵀ @ g"),
                           "product"),
    # ops that only move numbers around: the gradient is moved back
    "ExpandBackward0": Rule(("self",), "{out} = {self}.expand({out_shape})",
                            ("g summed over the dims expand stretched, back to {in_shape}",), "shape"),
    "ViewBackward0": _VIEW,
    "UnsafeViewBackward0": _VIEW,
    "ReshapeAliasBackward0": _VIEW,
    "SqueezeBackward0": _SQUEEZE,
    "SqueezeBackward1": _SQUEEZE,
    "SqueezeBackward2": _SQUEEZE,
    "SqueezeBackward3": _SQUEEZE,
    "SqueezeBackward4": _SQUEEZE,
    "UnsqueezeBackward0": _SQUEEZE,
    "TBackward0": Rule(("self",), "{out} = {self}.t()", ("gᵀ (transposed back)",), "shape"),
    "TransposeBackward0": Rule(("self",), "{out} = {self} with two dims swapped",
                               ("g with the same two dims swapped back",), "shape"),
    "PermuteBackward0": Rule(("self",), "{out} = {self} with its dims permuted",
                             ("g with its dims put back in their first order",), "shape"),
    "CloneBackward0": Rule(("self",), "{out} = {self}.clone()", ("g, unchanged",), "identity"),
    "AliasBackward0": Rule(("self",), "{out} = {self} (an alias)", ("g, unchanged",), "identity"),
}
