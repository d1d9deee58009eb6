"""Saving and loading a model's weights with its config (what probes read from a run folder)."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import torch

from ablate.errors import AblateError
from ablate.model import GPT, GPTConfig
from ablate.store import CHECKPOINTS, FINAL_WEIGHTS, atomic_write_bytes


def save_model(model: GPT, path: str | Path) -> None:
    buffer = io.BytesIO()
    torch.save({"config": dataclasses.asdict(model.config), "state_dict": model.state_dict()}, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def load_model(path: str | Path) -> GPT:
    blob = torch.load(path, map_location="cpu", weights_only=True)
    model = GPT(GPTConfig(**blob["config"]))
    model.load_state_dict(blob["state_dict"])
    return model.eval()


def load_trained_model(run_dir: str | Path) -> GPT:
    """The final weights of a run (RUN_DIR/checkpoints/model.pt), in eval mode on the CPU."""
    path = Path(run_dir) / CHECKPOINTS / FINAL_WEIGHTS
    if not path.is_file():
        raise AblateError(f"{run_dir} has no trained weights ({path} is missing): has the run completed?")
    return load_model(path)
