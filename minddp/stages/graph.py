"""What a backward from a forward's outputs will reach: the parameters in the autograd graph.

Walking back from the outputs' ``grad_fn`` finds every ``AccumulateGrad`` node: each holds a parameter a
backward from those outputs would reach. A parameter not found is one this forward did not use. The outputs
may be nested (tuples, lists, dicts, dataclasses such as Hugging Face's ``ModelOutput``).

Example::

    >>> model = torch.nn.ModuleDict({"body": torch.nn.Linear(4, 2), "unused_head": torch.nn.Linear(2, 1)})
    >>> reached = parameters_reached(model["body"](torch.ones(1, 4)))    # ids of the parameters in the graph
    >>> [n for n, p in model.named_parameters() if id(p) not in reached]
    ['unused_head.weight', 'unused_head.bias']
"""

from __future__ import annotations

from typing import Any

from minddp.runtime.nested import tensors_in


def parameters_reached(outputs: Any) -> set[int]:
    """ids of the leaf tensors whose ``AccumulateGrad`` node is reachable from ``outputs``."""
    seen, found = set(), set()
    stack = [t.grad_fn for t in tensors_in(outputs) if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # only AccumulateGrad nodes have one
        if variable is not None:
            found.add(id(variable))
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found
