"""An EMA teacher: a copy of G on its own devices (the device map's ``t`` role, no optimizer) that
labels images for G and follows G by an exponential moving average after each of G's steps. The
mean teacher (French et al., DACS) and UniMatch V2 share it; each says what its EMA averages and
in which mode its teacher predicts."""

from __future__ import annotations

import torch

from segadv.engine.network import Network
from segadv.methods import mixing
from segadv.methods.adversarial import hand_over
from segadv.monitor.profile import PhaseTimer
from segadv.parallel import distributed, fsdp


class EMATeacher:
    def __init__(self, teacher: Network, g: Network, phases: PhaseTimer, *, buffers: bool) -> None:
        """``buffers``: the EMA averages G's floating buffers (BatchNorm's running statistics) with
        its parameters, for a teacher that predicts with them; else the parameters alone. Integer
        buffers (BatchNorm's batch counter) are never averaged."""
        self.net, self.g, self.phases = teacher, g, phases
        self.buffers = buffers
        self.sharded = fsdp.is_sharded(teacher.bare)
        if self.sharded != fsdp.is_sharded(g.bare):
            raise TypeError("the teacher and G must be sharded alike (parallel.generator=fsdp shards both)")
        self.pairs = self.averaged()

    def averaged(self) -> list[list[torch.Tensor]]:
        """What the EMA averages, in the same order on both. Sharded (FSDP), each rank's shard of
        each parameter: the teacher is sharded like G (same units, same ranks), so shard i of the
        teacher pairs with shard i of G and the EMA needs no gather; taken after both are
        resharded, so the tensors written are the ones the next all-gather reads."""
        if self.sharded:
            fsdp.reshard(self.net.bare)
            fsdp.reshard(self.g.bare)
        return [fsdp.local_tensors(list(m.parameters()))
                + ([b for b in m.buffers() if b.is_floating_point()] if self.buffers else [])
                for m in (self.net.bare, self.g.bare)]

    @torch.no_grad()
    def labels(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The teacher's argmax and top probability on ``images`` (on G's device), in the mode the
        caller set: the teacher on its own devices under its own autocast, both maps handed back
        to G's device."""
        g, t = self.g, self.net
        with self.phases.phase("g_fwd_bwd", t.device):
            on_teacher = hand_over(self.phases, images, g, t)
            with t.autocast():
                logits = t.module(on_teacher)
            confidence, pseudo = mixing.teacher_confidence(logits.float())
        return hand_over(self.phases, pseudo, t, g), hand_over(self.phases, confidence, t, g)

    @torch.no_grad()
    def update(self, decay: float) -> None:
        """``teacher <- decay * teacher + (1 - decay) * G`` across devices without a host sync; under
        DDP every rank's teacher then takes rank 0's buffers (its parameters are equal already: the
        EMA of G's synchronised ones; each rank's G has its own BatchNorm statistics). Under FSDP
        each rank averages its own shards (buffers are not sharded: rank 0's are given as under DDP)."""
        with self.phases.phase("optimizer", self.net.device):
            mixing.ema_update_(*(self.averaged() if self.sharded else self.pairs), decay)
            if self.sharded:
                fsdp.forget_forwards(self.net.bare)  # its no_grad forwards: no backward ever clears them
            distributed.broadcast_buffers(self.net.bare)
