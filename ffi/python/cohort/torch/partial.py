"""Partial / selective synchronisation of a PyTorch model (docs/torch.md).

Instead of averaging gradients over every rank each step (DDP), each rank
trains on its own and, after its optimizer step, averages its *parameters*
with the group of ranks cohort's scheduler puts together: the ranks ready at
about the same time (partial), or of similar speed, waiting a little for
ones about to be ready when that pays (selective). A straggler no longer
sets the pace: it joins the groups it can.

    dist.init_process_group("cohort")
    sync = cohort.torch.PartialSync(model, optimizer, mode="selective")
    for x, y in data:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
        sync.step()                   # after the optimizer step
    sync.leave()                      # done training; evaluation may follow
    dist.all_reduce(val_loss)         # (a world collective leaves on its own too)

What is averaged: the parameters, floating-point buffers (batch norm's
running statistics) and, with sync_optimizer_state, the optimizer's
per-parameter state of the same shape (momentum, Adam's moments): averaging
parameters but not momentum makes the momentum push each rank back toward
its own pre-sync trajectory. The average is weighted by each member's local
steps since its last sync, so a fast rank's progress counts for more.
"""

import torch
import torch.distributed as dist

from . import _c10d, _group

__all__ = ["PartialSync"]


class PartialSync:
    """Average a model's parameters with the group the scheduler picks.

    model: the torch.nn.Module (not wrapped in DDP).
    optimizer: its optimizer (optional), whose per-parameter state is
        averaged too when sync_optimizer_state.
    mode: "selective" (groups of similar speed), "partial" (the first p
        ready ranks), "allreduce" (every rank: a plain periodic average) or
        "relay"; the same on every rank.
    every: sync after every this many local steps (weight = local steps).
    group: a cohort process group (default: the default group).
    """

    def __init__(self, model, optimizer=None, mode="selective", every=1, group=None,
                 sync_optimizer_state=True):
        if mode not in ("default", "selective", "partial", "allreduce", "relay"):
            raise ValueError("PartialSync: unknown mode %r" % (mode,))
        if int(every) < 1:
            raise ValueError("PartialSync: every must be >= 1")
        self.model = model
        self.optimizer = optimizer
        self.mode = mode
        self.every = int(every)
        self.group = _group(group)
        self.sync_optimizer_state = sync_optimizer_state
        self.steps = 0          # local optimizer steps so far (the sync's iteration)
        self.since = 0          # local steps since this rank's last sync (its weight)
        self.syncs = 0
        self.last = None        # the last sync's group
        self.wait_us = 0.0      # summed over the syncs: waiting for a group
        self.comm_us = 0.0      # and exchanging with it
        self._flat = None

    def _tensors(self):
        ts = [p.data for p in self.model.parameters()]
        ts += [b for b in self.model.buffers() if b.is_floating_point()]
        if self.optimizer is not None and self.sync_optimizer_state:
            for g in self.optimizer.param_groups:
                for p in g["params"]:
                    st = self.optimizer.state.get(p, {})
                    for k in sorted(st):
                        v = st[k]
                        if (isinstance(v, torch.Tensor) and v.is_floating_point()
                                and v.shape == p.shape):
                            ts.append(v)
        for t in ts:
            if t.device.type != "cpu":
                raise ValueError("PartialSync: CPU tensors only (found one on %s)" % t.device)
        return ts

    def _pack(self):
        """The tensors, and one float32 buffer holding them end to end."""
        ts = self._tensors()
        n = sum(t.numel() for t in ts)
        if self._flat is None or self._flat.numel() != n:
            self._flat = torch.empty(n, dtype=torch.float32)
        off = 0
        for t in ts:
            self._flat[off:off + t.numel()].copy_(t.reshape(-1))
            off += t.numel()
        return ts, self._flat

    @staticmethod
    def _unpack(ts, flat):
        off = 0
        for t in ts:
            t.copy_(flat[off:off + t.numel()].view_as(t))
            off += t.numel()

    @torch.no_grad()
    def step(self):
        """Call after each optimizer step. Every `every` local steps, joins a
        sync: the model (and optimizer state) becomes the group's weighted
        average. Returns the group ({"members", "full", "wait_us", ...}) when
        it synced, else None."""
        self.steps += 1
        self.since += 1
        if self.steps % self.every:
            return None
        ts, flat = self._pack()
        info = _c10d.sync(self.group, flat, self.steps, float(self.since), self.mode)
        self._unpack(ts, flat)
        self.since = 0
        self.syncs += 1
        self.last = info
        self.wait_us += info.get("wait_us", 0.0)
        self.comm_us += info.get("comm_us", 0.0)
        return info

    def leave(self):
        """Out of the schedule (done training): no group waits for this rank.
        A collective on the group does this by itself."""
        _c10d.sync_leave(self.group)

    @torch.no_grad()
    def average(self):
        """A full average over every rank (plain allreduce of the model, not
        weighted): e.g. once before evaluating, so every rank holds the same
        model."""
        ts, flat = self._pack()
        dist.all_reduce(flat, op=dist.ReduceOp.AVG, group=self.group)
        self._unpack(ts, flat)
