"""The exceptions that bad data raises, each listing every problem at once."""

from __future__ import annotations

from pathlib import Path


class DatasetError(ValueError):
    """The dataset cannot be trained on; ``problems`` names every bad file or folder and why."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        count = len(self.problems)
        head = f"the dataset has {count} problem{'s' if count != 1 else ''}:"
        super().__init__("\n".join([head, *(f"  - {p}" for p in self.problems)]))


class DatasetTomlError(ValueError):
    """A dataset TOML that cannot be used; ``problems`` names every bad key."""

    def __init__(self, problems: list[str], path: Path) -> None:
        self.problems = list(problems)
        super().__init__(f"{path}: " + "; ".join(self.problems))
