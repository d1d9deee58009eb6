"""A benchmark arm of benchmarks/blocked_arms.py: a sliding window given as a score bias (0 for the 256 keys a query
sees, −∞ before them), so it trains on the fused path with SDPA's additive (H, T, T) mask (`ablate.arms.kernel`).
Loaded with `--arm-file`, as a user's arm is."""

import torch

from ablate.arms import Arm, register_arm

WINDOW = 256


@register_arm("bench-bias-window", replace=True)
class BiasWindow(Arm):
    description = "score bias: 0 within the last 256 keys, −∞ before (a window through the score-bias slot)"

    def score_bias(self, query_pos, key_pos):
        distance = query_pos.unsqueeze(1) - key_pos.unsqueeze(0)  # (Tq, Tk), i − j
        bias = torch.zeros(distance.shape, device=distance.device).masked_fill(distance >= WINDOW, float("-inf"))
        return bias.unsqueeze(0).expand(self.ctx.n_head, -1, -1)
