"""The small real tasks the synchronisation runs train: scikit-learn's bundled datasets (no
download) and an MLP.

- ``digits``: 8x8 handwritten digits (1,797 images, 10 classes), a 64-64-10 MLP by default;
  it reaches 95% test accuracy in 10^2-10^3 updates of plain SGD.
- ``cancer``: the Wisconsin breast-cancer table (569 rows, 30 features, 2 classes), a
  30-32-2 MLP.
- ``text``: next-character prediction on CPython's bundled documentation prose with a
  small causal transformer (:mod:`executor.sync.text`; ``hidden`` = width, layers).
- ``digits-resnet18``: the digits as 3 x 32 x 32 images (each pixel a 4 x 4 block, its grey
  level in every channel) on torchvision's ResNet-18 with 10 classes (11,181,642
  parameters, a 44.7 MB gradient): the graph workload the issue names "resnet18 on small
  inputs", whose step takes about 500 times the MLP's compute and 2,300 times its bytes
  (no ``hidden`` widths).

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

__all__ = ["TASKS", "TABLE_TASKS", "CLI_TASKS", "COMPARE_DEFAULTS", "check_task",
           "Task", "load_task", "mlp", "build_model"]

TASKS = {"digits": (64,), "cancer": (32,), "text": TEXT_HIDDEN,  # default hidden widths
         "digits-resnet18": ()}
TABLE_TASKS = ("digits", "cancer")  # labelled rows on an MLP (federated runs, the sweeps)
CLI_TASKS = (*TABLE_TASKS, "digits-resnet18")  # what ``trainsim execute --task`` offers
IMAGE_SCALE = 4  # digits-resnet18: 8 x 8 pixels -> 32 x 32
# (local steps, probe repetitions, steps between evaluations: 0 only at the start and end)
# a measured-beside-predicted run takes by default: a ResNet-18 step is about 500 times the
# MLP's, and its evaluation (360 images) takes about as long as a step, so it stays out of
# the timed window
COMPARE_DEFAULTS = {"digits": (300, 200, 10), "cancer": (300, 200, 10), "text": (300, 200, 10),
                    "digits-resnet18": (40, 10, 0)}


def check_task(task: str, plan: object, hidden: tuple[int, ...] | None) -> None:
    """One-line errors for a task the real runs cannot train as asked."""
    from sim.errors import SpecError

    if task not in TASKS:
        raise SpecError("task", f"must be one of {', '.join(TASKS)}, got {task!r}")
    if task != "digits-resnet18":
        return
    if hidden:
        raise SpecError("hidden", "digits-resnet18 trains torchvision's ResNet-18: no hidden "
                        f"widths, got {list(hidden)}")
    per = plan.global_batch_size // plan.dp  # type: ignore[attr-defined]
    if per < 2:
        raise SpecError("plan.global_batch_size", f"digits-resnet18 needs at least 2 images a "
                        f"worker (batch norm over 1 x 1 maps), got {per}")


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
        """(test loss, test accuracy), in eval mode (batch norm's running statistics)."""
        training = model.training
        model.eval()
        with torch.no_grad():
            logits = model(self.x_test)
            loss = F.cross_entropy(logits, self.y_test).item()
            acc = (logits.argmax(1) == self.y_test).float().mean().item()
        model.train(training)
        return loss, acc


def load_task(name: str, seed: int = 0) -> Task | TextTask:
    if name == "text":
        return load_text(seed)
    from sklearn.datasets import load_breast_cancer, load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}")
    image = name == "digits-resnet18"
    data = load_breast_cancer() if name == "cancer" else load_digits()
    x_tr, x_te, y_tr, y_te = train_test_split(data.data, data.target, test_size=0.2,
                                              random_state=seed, stratify=data.target)
    scaler = StandardScaler().fit(x_tr)

    def as_x(a: object) -> torch.Tensor:
        # digits' pixels are 0..16 and some (nearly) constant: divided by 16, not z-scored
        x = scaler.transform(a) if name == "cancer" else a / 16.0  # type: ignore[operator]
        t = torch.tensor(x, dtype=torch.float32)
        return _as_images(t) if image else t

    return Task(name, as_x(x_tr), torch.tensor(y_tr), as_x(x_te), torch.tensor(y_te),
                int(data.target.max()) + 1)


def _as_images(x: torch.Tensor) -> torch.Tensor:
    """(n, 64) digits -> (n, 3, 32, 32): each pixel a square block, its level in every channel."""
    img = x.view(-1, 1, 8, 8).repeat_interleave(IMAGE_SCALE, 2).repeat_interleave(IMAGE_SCALE, 3)
    return img.expand(-1, 3, -1, -1).contiguous()


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
    if task.name == "digits-resnet18":
        from profiler.graph.vision import import_torchvision

        torch.manual_seed(seed)
        return import_torchvision().models.resnet18(weights=None, num_classes=task.classes)
    return mlp(task, hidden, seed)
