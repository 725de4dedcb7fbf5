"""Tests of PyTorch's suites whose outcome or warnings differ under a Lens, each with its reason.

Keys are test ids without the file part (``Class::test``).  Kinds:

``lens-defect``  the lens changes what the test observes; being fixed (xfail(strict=True) in CI)
``observer``     the test checks something any observer changes (internal counters, refcounts,
                 timing); not a lens defect (not counted in CI, with the reason)

Each reason names the repro in RESULTS.md (D1..D4).
"""

_WARN_LOCATION = (
    "D1: a warning torch raises during backward with a stacklevel (here BackwardHook's 'Full backward hook is "
    "firing when gradients are computed with respect to module outputs') is attributed to "
    "torch/autograd/__init__.py instead of the user's backward() line: the lens's two Python frames "
    "(traced_run_backward, Lens._run) between torch.autograd.backward and the engine shift the stack"
)
_GRADIENT_EDGE = (
    "D3: lens-only RuntimeWarning 'autograd_lens: could not record backward pass' for autograd.grad of a sparse "
    "or mkldnn input: observe.PassObserver._c_hooks_on_inputs calls torch.autograd.graph.get_gradient_edge, "
    "which does input.view_as(input), unsupported for these layouts"
)
_NESTED = (
    "D4: lens-only RuntimeWarning 'autograd_lens: could not trace a backward pass' for a nested-tensor root: "
    "walk._storage_key reads .size() of a NestedTensor"
)

KNOWN: dict[str, tuple[str, str]] = {
    "TestAutograd::test_node_post_hook_registered_during_unpack_hook": (
        "lens-defect",
        "D2: a node post-hook registered while the node unpacks a saved tensor receives non-None grad_inputs: the "
        "lens's own post-hook on every node makes the engine keep the node's inputs (has_post_hooks is decided "
        "before the node runs)",
    ),
    "TestAutograd::test_gradcheck_dense_and_sparse_inputs": ("lens-defect", _GRADIENT_EDGE),
    "TestAutograd::test_gradcheck_multiple_mkldnn_inputs": ("lens-defect", _GRADIENT_EDGE),
    **{f"TestAutograd::test_gradcheck_input_layout{i}": ("lens-defect", _GRADIENT_EDGE) for i in range(5)},
    "TestAutogradMultipleDispatchCPU::test_autograd_multiple_dispatch_registrations_cpu": ("lens-defect", _NESTED),
    "TestAutogradMultipleDispatchCPU::test_autograd_composite_implicit_and_dispatch_registration_cpu": (
        "lens-defect", _NESTED),
    **{f"TestModuleHooks::test_{name}_named_tuple_{flag}": ("lens-defect", _WARN_LOCATION)
       for name in ("full_backward_hooks", "full_backward_pre_hooks", "mixed_hooks") for flag in (False, True)},
    "TestModuleHookNN::test_hook_no_requires_grad": ("lens-defect", _WARN_LOCATION),
}
