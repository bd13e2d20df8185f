"""The small real tasks the synchronisation runs train: scikit-learn's bundled datasets (no
download) and an MLP.

- ``digits``: 8x8 handwritten digits (1,797 images, 10 classes), a 64-64-10 MLP by default;
  it reaches 95% test accuracy in 10^2-10^3 updates of plain SGD.
- ``cancer``: the Wisconsin breast-cancer table (569 rows, 30 features, 2 classes), a
  30-32-2 MLP.
- ``text``: next-character prediction on CPython's bundled documentation prose with a
  small causal transformer (:mod:`executor.sync.text`; ``hidden`` = width, layers).

Digits' pixels (0-16) are divided by 16; the cancer table's columns standardised on the
training split (scikit-learn's ``StandardScaler``); the test split (20%, stratified) is fixed
by the seed. Worker ``w`` of ``n`` samples its mini-batches from its own shard (every
``n``-th training row from ``w``: an IID split).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from executor.sync.text import TEXT_HIDDEN, CharTransformer, TextTask, load_text

__all__ = ["TASKS", "Task", "load_task", "mlp", "build_model"]

TASKS = {"digits": (64,), "cancer": (32,), "text": TEXT_HIDDEN}  # default hidden widths


@dataclass
class Task:
    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    classes: int

    def shard(self, worker: int, workers: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x_train[worker::workers], self.y_train[worker::workers]

    def sample(self, data: tuple[torch.Tensor, torch.Tensor], batch: int,
               gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """A mini-batch of rows of a worker's shard, drawn with replacement."""
        idx = torch.randint(0, len(data[0]), (batch,), generator=gen)
        return data[0][idx], data[1][idx]

    def evaluate(self, model: torch.nn.Module) -> tuple[float, float]:
        """(test loss, test accuracy)."""
        with torch.no_grad():
            logits = model(self.x_test)
            loss = F.cross_entropy(logits, self.y_test).item()
            acc = (logits.argmax(1) == self.y_test).float().mean().item()
        return loss, acc


def load_task(name: str, seed: int = 0) -> Task | TextTask:
    if name == "text":
        return load_text(seed)
    from sklearn.datasets import load_breast_cancer, load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    data = {"digits": load_digits, "cancer": load_breast_cancer}[name]()
    x_tr, x_te, y_tr, y_te = train_test_split(data.data, data.target, test_size=0.2,
                                              random_state=seed, stratify=data.target)
    scaler = StandardScaler().fit(x_tr)

    def as_x(a: object) -> torch.Tensor:
        # digits' pixels are 0..16 and some (nearly) constant: divided by 16, not z-scored
        x = a / 16.0 if name == "digits" else scaler.transform(a)  # type: ignore[operator]
        return torch.tensor(x, dtype=torch.float32)

    return Task(name, as_x(x_tr), torch.tensor(y_tr), as_x(x_te), torch.tensor(y_te),
                int(data.target.max()) + 1)


def mlp(task: Task, hidden: tuple[int, ...], seed: int) -> torch.nn.Sequential:
    """Linear-ReLU layers of widths ``hidden`` then a linear classifier; the same weights on
    every rank for one seed."""
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    width = task.x_train.shape[1]
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    layers.append(torch.nn.Linear(width, task.classes))
    return torch.nn.Sequential(*layers)


def build_model(task: Task | TextTask, hidden: tuple[int, ...], seed: int) -> torch.nn.Module:
    """The task's model, the same weights on every rank for one seed."""
    if isinstance(task, TextTask):
        torch.manual_seed(seed)
        return CharTransformer(task.classes, *hidden)
    return mlp(task, hidden, seed)
