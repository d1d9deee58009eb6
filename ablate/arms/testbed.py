"""The mechanism testbed's own control arm, outside the study: a value gate that knows which reads are junk.

`oracle-gate` is the positive control of the value-junk task (`ablate.data.valuejunk`): it zeroes exactly the
junk reads (g_j = 0 there, 1 elsewhere), reading the same junk mask that the task model used to inject them
(`ablate.taskmodel.ValueJunkAttention` hands it over each forward). It is what a perfect value-slot filter does,
known by construction to lower the loss where junk hurts, so a design that cannot detect it cannot test a gate.
It has no parameters and no meaning elsewhere: a run of it at any other tier is refused in one line before it starts
(`only_tasks`), and on any other model it has no mask and refuses in one line.
Registered by the testbed's experiment file (experiments/testbed.py imports this module), as an example is:
an experiment's `arms="all"` leaves it out.
"""

from __future__ import annotations

import torch

from ablate.arms.base import Arm, ArmContext, register_arm


@register_arm("oracle-gate")
class OracleGate(Arm):
    description = ("testbed control: a value gate that zeroes the value-junk task's junk reads (reads the task's "
                   "junk mask; nothing else)")
    example = True  # outside the study: arms="all" leaves it out
    only_tasks = ("value-junk-norm", "value-junk-direction")  # elsewhere there is no junk mask: refused before a run

    def __init__(self, ctx: ArmContext):
        super().__init__(ctx)
        self.junk_mask: torch.Tensor | None = None  # (B, T) bool, set by the value-junk attention each forward

    def value_gate(self, v, x):
        if self.junk_mask is None:
            raise ValueError("arm 'oracle-gate' reads the junk mask of the value-junk task; it runs on the tiers "
                             "value-junk-norm and value-junk-direction only")
        keep = ~self.junk_mask[:, None, : v.shape[2], None]  # keys are the first Tk positions (strictly earlier)
        return keep.to(v.dtype).expand(-1, v.shape[1], -1, -1)
