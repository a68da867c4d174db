"""Every wrapper behaves like torch's DDP as an nn.Module: .module, parameters, buffers, state_dict, train/eval."""

import torch
import toy_models
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from minddp import launch
from minddp.ladder import SHARDED_GRADIENTS, STAGES, build_stage, options_for


def module_api():
    out = {}
    reference = TorchDDP(toy_models.build("bn", 0))
    ref_state = reference.state_dict()
    for name in STAGES:
        model = toy_models.build("bn", 0)
        ddp = build_stage(name, model, **options_for(name, bucket_cap_mb=0.0005))
        state = ddp.state_dict()
        # zero2 and fsdp hold this rank's shards under the parameters' names (as torch's FSDP holds
        # DTensors); whole, they are the model's
        whole = {"module." + k: v for k, v in ddp.full_state_dict().items()} if name in SHARDED_GRADIENTS else state
        out[name] = {
            "module_is_model": ddp.module is model,
            "keys_match_torch": list(state) == list(ref_state) and list(whole) == list(ref_state),
            "values_match_torch": all(torch.equal(whole[k], ref_state[k]) for k in ref_state),
            "buffers": [tuple(b.shape) for b in ddp.buffers()] == [tuple(b.shape) for b in reference.buffers()],
            "params": [p.data_ptr() for p in ddp.parameters()] == [p.data_ptr() for p in model.parameters()],
        }
        ddp.eval()
        out[name]["eval_propagates"] = not model.training
        ddp.train()
        out[name]["train_propagates"] = model.training
        ddp.load_state_dict(state)  # round trip, as a checkpoint would
    return out


def test_wrappers_are_modules_like_torch_ddp():
    for rank_out in launch(module_api, world_size=2, timeout_s=60):
        for stage, checks in rank_out.items():
            failed = [k for k, ok in checks.items() if not ok]
            assert not failed, f"stage {stage}: {failed}"


def freed_after_training():
    """Each wrapper after one synced step, its last name deleted: is it gone (as torch's DDP is)?

    The user's model also starts a collective of its own inside the forward and holds its Work past the check:
    gloo's Work keeps the thread's state of its start (the autograd saved-tensor hooks among it) until the Work is
    dropped, as gloo's worker also does for a while after ``wait()`` returns. What a wrapper puts in that state
    must not keep the wrapper alive.
    """
    import gc
    import weakref

    import torch.distributed as dist

    gone, works = {}, []
    for name in [*STAGES, "torch"]:
        model = toy_models.build("bn", 0)
        model.register_forward_pre_hook(lambda m, args: works.append(dist.all_reduce(torch.ones(1), async_op=True)))
        ddp = (
            TorchDDP(model) if name == "torch" else build_stage(name, model, **options_for(name, bucket_cap_mb=0.0005))
        )
        toy_models.loss_fn(ddp, toy_models.global_batches("bn", 1, 4)[0]).backward()
        if name != "torch":
            ddp.finish_gradient_synchronization()
        refs = weakref.ref(ddp), weakref.ref(model)
        del ddp, model
        gc.collect()
        gone[name] = [r() is None for r in refs]
    for work in works:  # held (unwaited) until now
        work.wait()
    return gone


def test_a_wrapper_is_freed_when_dropped_like_torch_ddp():
    # A wrapper that outlives its last name keeps its model, its buffers and the process group (with its
    # threads) alive: in a notebook, every re-run would add one. The autograd hooks must not hold it.
    for rank_out in launch(freed_after_training, world_size=2, timeout_s=60):
        assert rank_out["torch"] == [True, True]  # the oracle: torch's own DDP is freed
        kept = {stage: gone for stage, gone in rank_out.items() if gone != [True, True]}
        assert not kept, f"[wrapper freed, model freed] per stage: {kept}"
