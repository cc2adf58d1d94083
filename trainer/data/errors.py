"""The one exception that bad data raises, listing every problem at once."""

from __future__ import annotations


class DatasetError(ValueError):
    """The dataset cannot be trained on; ``problems`` names every bad file or folder and why."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        count = len(self.problems)
        head = f"the dataset has {count} problem{'s' if count != 1 else ''}:"
        super().__init__("\n".join([head, *(f"  - {p}" for p in self.problems)]))
