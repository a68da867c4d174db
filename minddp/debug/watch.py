"""What debug mode checks on a wrapped model at each step: replicas, gradients, data, ``requires_grad``.

Every wrapper's constructor calls :func:`minddp.debug.switch.attach`; while debug mode is on, that calls
:func:`checks_for`, which installs the collective check and, on a wrapper whose ranks hold whole
replicas (the six teaching stages, ``ddp``), puts a :class:`Watch` on it; a sharded wrapper
(``sharded = True``: ``zero2``, ``fsdp``; ``local-sgd`` and ``diloco``, whose replicas differ between
syncs) gets the collective check only, since its ranks hold different values by design. A
:class:`Watch` hooks the wrapper, its module's submodules and parameters,
and (its own hook, removed with the wrapper) every optimizer that steps them, and at each step
compares, across ranks, a fingerprint of each tensor (:func:`fingerprints`: integer, exact, changed by
any one 16-bit word changed, and by two words swapped) with one small all_gather; a full comparison runs only on a
mismatch:

1. **forward check**, before each forward that will sync: ``requires_grad`` (a layer frozen on some
   ranks), the parameters (replicas that drifted apart since the last step) and the buffers a wrapper
   does not broadcast each step;
2. **step check**, before each ``optimizer.step()`` over the wrapped parameters: the gradients, which
   averaging made equal on every rank. Gradients that differ were never averaged (the module called
   directly, a backward inside ``no_sync()``) or were used by some ranks' forward only; local
   gradients with the same fingerprints on every rank, step after step, mean every rank read the same data;
3. a finding is one line on every rank (:func:`minddp.debug.findings.finding`): an error, except for
   buffers and data (warnings, once: they do not corrupt the model).

Each watch counts its wrapper's steps; the collectives made in them are said with that count
(:func:`minddp.debug.collective_check.in_step_of`). Every rank decides from the same gathered table, so
every rank raises at the same point and the extra all_gather of a full comparison is always paired.
Inside ``join()`` the checks pause (a joined rank takes no steps) and resume after it. What each finding means:
``docs/debugging.md``.

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> fingerprints([torch.ones(3), None], torch.device("cpu"))  # 1.0: words 0, 16256 (16256 * 48846)
    tensor([794040576,         0])
"""

from __future__ import annotations

import sys
import warnings
import weakref

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from minddp.debug import collective_check, switch
from minddp.debug.collective_check import BY
from minddp.debug.findings import DebugError, DebugWarning, finding
from minddp.runtime import keep
from minddp.runtime.compat import inside_join
from minddp.runtime.device import message_device

#: Local gradients with the same fingerprints on every rank this many steps in a row: every rank reads the same data.
SAME_DATA_STEPS = 3
#: Bits of the step check's notes: the step's last forward ran in no_sync(); a forward bypassed the wrapper;
#: every trainable parameter's local gradient was fingerprinted (a synced backward computed them all).
_NO_SYNC, _DIRECT, _ALL_LOCAL = 1, 2, 4
#: The fingerprint (:func:`fingerprints`): a tensor's 16-bit words, the i-th weighted by RUN_ROOT**(i % RUN) modulo
#: RUN_PRIME (distinct in a run: RUN_ROOT is a primitive root) and by ROOT**(i // RUN) modulo the prime P, summed mod P.
P, ROOT = 2**31 - 1, 7
RUN, RUN_PRIME, RUN_ROOT = 65520, 65521, 17  # a word times its weight fits int32: 2**15 * 65520 < 2**31
BLOCK = 256  # runs summed at once: a product of 64 MiB at most
_weights: dict = {}  # device -> the weights of a run's words, RUN_ROOT**k mod RUN_PRIME (int32)


def checks_for(wrapper: nn.Module) -> "Watch | None":
    """What :func:`~minddp.debug.switch.attach` does while debug mode is on: the collective check, and a watch.

    None for a sharded wrapper (its ranks hold different shards: only its collectives can be compared).
    """
    collective_check.install()  # the script's collectives, and the wrapper's, are checked from now on
    if getattr(wrapper, "sharded", False):
        return None
    return Watch(wrapper, wrapper.module, wrapper.process_group)


def fingerprints(tensors: list, device: torch.device) -> torch.Tensor:
    """Each tensor's fingerprint, on ``device`` (0 for None): its 16-bit words, each weighted by its place, summed.

    Integer and exact on every device, in any order of summation (a product fits 31 bits, a run's sum 47, a sum
    modulo P 62): equal tensors give equal fingerprints; one word changed always changes it (a weight is not 0
    modulo P); two different words swapped within a run of 65520 words (just under 128 KiB) always change it (the
    weights of a run differ). Not per value: a float32 is two words, and changes to both that cancel in the sum go
    unseen (1.0 and 0.99609476 at the start of a tensor); any other change goes unseen only when its weighted sum is
    a multiple of P, about one in 2**31 for changes not built for it.
    """
    prints = [
        _fingerprint(t).to(device) if t is not None else torch.zeros((), dtype=torch.int64, device=device)
        for t in tensors
    ]
    return torch.stack(prints) if prints else torch.zeros(0, dtype=torch.int64, device=device)


def _fingerprint(tensor: torch.Tensor) -> torch.Tensor:
    words = tensor.detach().reshape(-1).view(torch.int8 if tensor.element_size() == 1 else torch.int16)
    weights, device = _weights_on(words.device), words.device
    runs, tail = divmod(words.numel(), RUN)
    total = torch.zeros((), dtype=torch.int64, device=device)
    for first in range(0, runs, BLOCK):
        block = words[first * RUN : min(first + BLOCK, runs) * RUN].view(-1, RUN)
        sums = (block * weights).sum(dim=1).remainder_(P)  # int32 products, each run's sum in int64
        shift = torch.tensor([pow(ROOT, run, P) for run in range(first, first + len(sums))], device=device)
        total = (total + (sums * shift).remainder_(P).sum()) % P
    if tail:
        last = (words[runs * RUN :] * weights[:tail]).sum().remainder(P)
        total = (total + last * pow(ROOT, runs, P)) % P
    return total


def _weights_on(device: torch.device) -> torch.Tensor:
    if device not in _weights:
        weights = [pow(RUN_ROOT, k, RUN_PRIME) for k in range(RUN)]
        _weights[device] = torch.tensor(weights, dtype=torch.int32, device=device)
    return _weights[device]


class Watch:
    """The checks of one wrapper (module doc, steps 1-3), run from hooks: the wrapper's code is unchanged."""

    def __init__(self, wrapper: nn.Module, module: nn.Module, group):
        self.wrapper, self.ref = weakref.ref(wrapper), weakref.ref(self)
        self.name = type(wrapper).__name__
        self.group = dist.group.WORLD if group is None else group
        self.device = message_device(self.group)
        self.named = list(module.named_parameters())
        self.trainable = [(n, p) for n, p in self.named if p.requires_grad]
        self.ids = {id(p) for _, p in self.trainable}
        self.module = module
        self.step, self.steps_taken, self.same_data = -1, 0, 0
        self.inside = False  # in the wrapper's forward
        self.notes, self.direct_at = 0, ""
        self.arrived: set[int] = set()  # trainable parameters whose gradient this step's backwards computed
        self.local: dict[int, torch.Tensor] = {}  # their fingerprints before averaging (synced backwards only)
        self.syncing = False
        self.warned: set[str] = set()
        self.label_before = None
        handles = [
            wrapper.register_forward_pre_hook(self._before_forward),
            # always_call: after a forward that raised too (an out-of-memory retry), so nothing stays "inside"
            wrapper.register_forward_hook(self._after_forward, always_call=True),
            register_optimizer_step_pre_hook(self._before_optimizer_step),  # this watch's, removed with it
        ]
        for name, sub in module.named_modules():
            label = f"submodule {name!r}" if name else "the wrapped module"
            handles.append(sub.register_forward_pre_hook(self._direct_call(label)))
        # The wrapper's constructor attaches debug mode before it registers hooks of its own (its reducer, the
        # hook stages' averaging), so these run first on each gradient and see it local, before any average.
        handles += [
            p.register_post_accumulate_grad_hook(self._grad_ready(i)) for i, (_, p) in enumerate(self.trainable)
        ]
        weakref.finalize(wrapper, _remove, handles)  # the module may outlive its wrapper: its hooks go with it

    # -- hooks: what this rank did since the last step -----------------------------------------------

    def _before_forward(self, wrapper, inputs) -> None:
        if not switch.enabled():  # turned off since this wrapper was built (minddp.debug.disable)
            return
        self.inside = True
        self.label_before = collective_check.relabel(f"{self.name}'s forward")
        self.syncing = torch.is_grad_enabled() and getattr(wrapper, "require_backward_grad_sync", True)
        if not torch.is_grad_enabled():
            return
        if not self.syncing:
            self.notes |= _NO_SYNC
            return
        self.notes &= ~_NO_SYNC  # the step's last forward decides
        self.step = max(self.step + 1, self.steps_taken)
        collective_check.in_step_of(self)  # this wrapper's step: the collectives made now say it
        if not self._paused():
            self._forward_check()  # if it raises, the forward hook still runs (always_call)

    def _after_forward(self, wrapper, inputs, outputs) -> None:
        if self.inside:
            self.inside = False
            collective_check.relabel(self.label_before)

    def _direct_call(self, name: str):
        def noted(module, inputs) -> None:
            if not self.inside and torch.is_grad_enabled() and not self.notes & _DIRECT:  # the first one says it
                self.notes |= _DIRECT
                self.syncing = False
                self.direct_at = f"{name} was called directly at {collective_check.where_called()[0] or '?'}"

        return noted

    def _grad_ready(self, i: int):
        def ready(param: nn.Parameter) -> None:
            if not switch.enabled():  # paused (minddp.debug.disable)
                return
            collective_check.in_step_of(self)  # backward may run on another thread: its collectives are ours
            self.arrived.add(i)
            if self.syncing:
                self.local[i] = fingerprints([param.grad], self.device)[0]

        return ready

    def shadowed(self) -> None:
        """A step the others took while this rank had joined (``join()``): counted, so that after the block every
        rank names the same step."""
        self.step = max(self.step + 1, self.steps_taken)

    def _paused(self) -> bool:
        wrapper = self.wrapper()
        return wrapper is None or inside_join(wrapper) or not switch.enabled()

    # -- step 1: the forward check ------------------------------------------------------------------------

    def _forward_check(self) -> None:
        wrapper = self.wrapper()
        buffers = [] if getattr(wrapper, "broadcast_buffers", False) else list(self.module.named_buffers())
        flags = torch.tensor([p.requires_grad for _, p in self.named], dtype=torch.int64, device=self.device)
        params = fingerprints([p for _, p in self.named], self.device)
        row = torch.cat([flags, params, fingerprints([b for _, b in buffers], self.device)])
        table = self._gather(row, "forward check")
        n = len(self.named)
        flags, params, bufs = table[:, :n], table[:, n : 2 * n], table[:, 2 * n :]
        if (i := _first_difference(flags)) is not None:
            raise DebugError(self._frozen(i, flags))
        if (i := _first_difference(params)) is not None:
            raise DebugError(self._drifted(i, params))
        if (i := _first_difference(bufs)) is not None and "buffers" not in self.warned:
            self.warned.add("buffers")
            self._warn(self._buffers_differ(buffers, bufs, wrapper))

    def _frozen(self, i: int, flags: torch.Tensor) -> str:
        names = _alike([n for n, _ in self.named], flags, i)
        yes, no = _where_value(flags[:, i], 1), _where_value(flags[:, i], 0)
        return finding(
            "requires_grad differs across ranks",
            f"{_parameters(names)} {'requires' if len(names) == 1 else 'require'} grad on ranks {yes} but not on "
            f"ranks {no} at step {self.step}, so the ranks would send different gradients (this is not an unused "
            "parameter)",
            f"freeze (requires_grad_(False)) or unfreeze {_quoted(names)} on every rank, before wrapping the model; "
            "find_unused_parameters=True does not fix this",
            dist.get_rank(),
            BY,
        )

    def _drifted(self, i: int, params: torch.Tensor) -> str:
        name, tensor = self.named[i]
        others = [self.named[j][0] for j in _differences(params) if j != i]
        return finding(
            "replicas drifted apart",
            f"parameter {name!r} differs across ranks at step {self.step}, before its forward ("
            f"{self._compare(tensor, params[:, i])}){_and_more(others)}: it changed on some ranks only since "
            f"{'the wrapper was built' if self.step == 0 else f'step {self.step - 1}'}: an in-place edit or "
            "load_state_dict on some ranks, or an optimizer with other settings (lr, weight decay) on some ranks",
            "change parameters the same way on every rank (or broadcast them from rank 0 after the change), and "
            "give every rank the same optimizer",
            dist.get_rank(),
            BY,
        )

    def _buffers_differ(self, buffers: list, bufs: torch.Tensor, wrapper) -> str:
        differ = [buffers[j][0] for j in _differences(bufs)]
        names = ", ".join(repr(n) for n in differ[:3]) + (f" and {len(differ) - 3} more" if len(differ) > 3 else "")
        why = (
            "broadcast_buffers=False keeps each rank's own"
            if hasattr(wrapper, "broadcast_buffers")
            else f"{self.name} broadcasts buffers only when it is built"
        )
        return finding(
            "buffers differ across ranks",
            f"{'buffer' if len(differ) == 1 else 'buffers'} {names} {'differs' if len(differ) == 1 else 'differ'} "
            f"across ranks at step {self.step} ({why}): each rank evaluates and checkpoints its own statistics",
            "pass broadcast_buffers=True (rank 0's buffers before each step, torch's default), or convert the "
            "model with torch.nn.SyncBatchNorm.convert_sync_batchnorm",
            dist.get_rank(),
            BY,
        )

    # -- step 2: the step check -----------------------------------------------------------------------

    def _before_optimizer_step(self, optimizer, args, kwargs) -> None:
        """torch's optimizer step pre-hook (one per watch): the step check, if ``optimizer`` steps this model."""
        if self.ids.isdisjoint(id(p) for group in optimizer.param_groups for p in group["params"]):
            return
        self.step_check()

    def step_check(self) -> None:
        """Before ``optimizer.step()``: the gradients it will use, compared across ranks."""
        if self._paused():
            return
        collective_check.in_step_of(self)
        step = max(self.step, self.steps_taken)
        grads = [p.grad for _, p in self.trainable]
        present = torch.tensor([g is not None for g in grads], dtype=torch.int64, device=self.device)
        arrived = torch.tensor([i in self.arrived for i in range(len(grads))], dtype=torch.int64, device=self.device)
        zero = torch.zeros((), dtype=torch.int64, device=self.device)
        local = torch.stack([self.local.get(i, zero) for i in range(len(grads))]) if grads else present
        complete = _ALL_LOCAL if len(self.local) == len(grads) else 0
        notes = torch.tensor([self.notes | complete], dtype=torch.int64, device=self.device)
        row = torch.cat([notes, present, fingerprints(grads, self.device), arrived, local])
        self.arrived, self.local, self.steps_taken = set(), {}, step + 1
        self.notes &= _NO_SYNC
        table = self._gather(row, "step check")
        n = len(grads)
        present, sums, arrived, local = (table[:, 1 + k * n : 1 + (k + 1) * n] for k in range(4))
        i = _first_difference(torch.cat([present, sums], dim=1))
        if i is not None:
            i %= n
            raise DebugError(self._not_averaged(i, step, present[:, i], arrived[:, i], sums[:, i], table))
        everyone_computed = bool((table[:, 0] & _ALL_LOCAL).all()) and n > 0
        self.same_data = self.same_data + 1 if everyone_computed and _first_difference(local) is None else 0
        if self.same_data >= SAME_DATA_STEPS and "data" not in self.warned:
            self.warned.add("data")
            self._warn(
                finding(
                    "every rank is reading the same data",
                    f"the local gradients (before averaging) had the same fingerprints on every rank in steps "
                    f"{step - SAME_DATA_STEPS + 1} to {step}, so each batch is computed {self.group.size()} times, "
                    "once per rank: most likely no DistributedSampler or shard (or the same seed for a random loader)",
                    "give each rank its own part of the data: DataLoader(dataset, sampler=DistributedSampler("
                    "dataset)) and sampler.set_epoch(epoch) each epoch",
                    dist.get_rank(),
                    BY,
                )
            )

    def _not_averaged(self, i, step, present, arrived, sums, table) -> str:
        name, param = self.trainable[i]
        if len(set(arrived.tolist())) > 1:
            n = len(self.trainable)
            names = _alike([t[0] for t in self.trainable], table[:, 1 + 2 * n : 1 + 3 * n], i)
            it = "it" if len(names) == 1 else "them"
            return finding(
                "a parameter unused on some ranks",
                f"{_parameters(names)} got a gradient on ranks {_where_value(arrived, 1)} but not on ranks "
                f"{_where_value(arrived, 0)} in step {step}: the forward did not use {it} there (a branch taken on "
                f"some ranks only), so {'its gradient was' if it == 'it' else 'their gradients were'} not averaged "
                "over every rank",
                "pass find_unused_parameters=True to the wrapper (it then averages zeros in for the ranks that did "
                f"not use {it}), or use every parameter on every rank",
                dist.get_rank(),
                BY,
            )
        notes = 0
        for rank_notes in table[:, 0].tolist():  # what any rank's forwards were
            notes |= rank_notes
        if notes & _DIRECT:
            why = (
                f"the forward did not go through the wrapper ({self.direct_at or 'a submodule was called directly'}), "
                "so backward left each rank's own gradient"
            )
            fix = "call the wrapper (model(x), not model.module(x) or a submodule) for every forward of a step"
        elif notes & _NO_SYNC:
            why = (
                "the step's last forward ran inside no_sync(), so its backward only accumulated each rank's own "
                "gradient"
            )
            fix = "run the last micro-batch of each step (forward and backward) outside `with model.no_sync():`"
        else:
            why = (
                "they were never averaged (simple and ga average in finish_gradient_synchronization()) or were "
                "changed on some ranks after averaging (clipped by a rank's own norm, edited)"
            )
            fix = "average before optimizer.step() and change gradients only in the same way on every rank"
        if bool(present.all()):
            compared = self._compare(param.grad, sums)
        else:
            compared = f"present on ranks {_where_value(present, 1)} only"
        return finding(
            "gradients never averaged",
            f"the gradient of {name!r} differs across ranks at optimizer.step() in step {step} ({compared}): {why}",
            fix,
            dist.get_rank(),
            BY,
        )

    # -- the cross-rank table and the full comparison ------------------------------------------------

    def _gather(self, row: torch.Tensor, what: str) -> torch.Tensor:
        with collective_check.labelled(f"minddp debug's {what} of {self.name}"):
            rows = keep.all_gather(row, self.group)  # kept until gloo lets go: never freed by its thread at exit
        return torch.stack(rows).cpu()

    def _compare(self, tensor: torch.Tensor, sums: torch.Tensor) -> str:
        """Every rank's ``tensor`` gathered, and how far each group of ranks is from rank 0's (the full comparison)."""
        with collective_check.labelled(f"minddp debug's full comparison of {self.name}"):
            values = keep.all_gather(tensor.detach().contiguous(), self.group)
        reference = values[0].double()
        largest = max(float((v.double() - reference).abs().max()) for v in values)
        differ = [r for r in range(len(values)) if int(sums[r]) != int(sums[0])]
        agree = [r for r in _where_value(sums, int(sums[0])) if r != 0]
        also = f"; {_ranks(agree)} as rank 0" if agree else ""
        return (
            f"{_ranks(differ)} {'differs' if len(differ) == 1 else 'differ'} from rank 0 by up to {largest:.3g}{also}"
        )

    def _warn(self, line: str) -> None:
        """Warn, pointing at the script's line (the optimizer step or forward it was found in), not minddp's."""
        frame, _ = collective_check.script_frame(sys._getframe(1))
        if frame is None:
            warnings.warn(DebugWarning(line), stacklevel=2)
        else:
            warnings.warn_explicit(DebugWarning(line), None, frame.f_code.co_filename, frame.f_lineno)


def _remove(handles: list) -> None:
    for handle in handles:
        handle.remove()


def _first_difference(table: torch.Tensor) -> int | None:
    """The first column whose value is not the same in every row (rank)."""
    differ = _differences(table)
    return differ[0] if differ else None


def _differences(table: torch.Tensor) -> list[int]:
    if table.numel() == 0:
        return []
    return (table.min(0).values != table.max(0).values).nonzero().view(-1).tolist()


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"


def _where_value(column: torch.Tensor, value: int) -> list[int]:
    return (column == value).nonzero().view(-1).tolist()


def _alike(names: list[str], table: torch.Tensor, i: int) -> list[str]:
    """The names of the columns whose values across ranks are those of column ``i``, in order."""
    return [name for j, name in enumerate(names) if torch.equal(table[:, j], table[:, i])]


def _quoted(names: list[str]) -> str:
    return " and ".join(filter(None, [", ".join(repr(n) for n in names[:-1]), repr(names[-1])]))


def _parameters(names: list[str]) -> str:
    return f"{'parameter' if len(names) == 1 else 'parameters'} {_quoted(names)}"


def _and_more(names: list[str]) -> str:
    if not names:
        return ""
    return (
        f"; {len(names)} more differ too ({', '.join(repr(n) for n in names[:3])}{', ...' if len(names) > 3 else ''})"
    )
