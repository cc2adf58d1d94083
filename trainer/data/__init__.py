"""The data pipeline: kohya folders, captions, buckets, caches and the batch sampler."""

from .dataset import Batch, TrainingData, prepare_dataset
from .errors import DatasetError
from .sample import ensure_sample_dataset, resolve_dataset_dir
from .text_cache import text_cache_allowed, text_cache_blocker

__all__ = [
    "Batch",
    "DatasetError",
    "TrainingData",
    "ensure_sample_dataset",
    "prepare_dataset",
    "resolve_dataset_dir",
    "text_cache_allowed",
    "text_cache_blocker",
]
