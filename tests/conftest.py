"""Shared fixtures: a private studio home per test session, the embedded tiny model."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# A fixed thread count: trainer/system/threads.py follows the machine's load, and float sums differ
# with the count, so the tests that compare two runs bit for bit need it fixed (and one thread
# keeps the browser tests' GUI server from fighting the browser for the cores). The policy has
# its own tests (test_threads.py), which lift this.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
# mixed_precision = "auto" on a CPU with bf16 units times a probe step to choose bf16 or fp32
# (trainer/run/cpu_precision.py): on a busy machine (two test workers on two cores) the tiny
# model's probe can come out either way, and a run that compares two trainings, or a reloaded
# file with the trained model, then fails. The tests assume no units, so auto is fp32 as on most
# CPUs; the probe and the choice have their own tests (test_cpu_bf16.py), which patch the units.
os.environ.setdefault("KOHYA_STUDIO_CPU_BF16_UNITS", "none")


@pytest.fixture(scope="session", autouse=True)
def studio_home(tmp_path_factory):
    """Keep the embedded model, sample dataset and caches out of the checkout."""
    home = tmp_path_factory.mktemp("studio_home")
    old = os.environ.get("KOHYA_STUDIO_HOME")
    os.environ["KOHYA_STUDIO_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("KOHYA_STUDIO_HOME", None)
    else:
        os.environ["KOHYA_STUDIO_HOME"] = old


@pytest.fixture(scope="session")
def tiny_model_dir(studio_home):
    """The embedded tiny SD 1.x model as a diffusers folder (built once per session)."""
    from trainer.config import EMBEDDED_MODEL
    from trainer.models.loader import resolve_model_path

    return resolve_model_path(EMBEDDED_MODEL)


@pytest.fixture
def no_network(monkeypatch):
    """Every socket closed: a test that uses it fails on any attempt to reach the network."""
    import socket

    import huggingface_hub.constants

    assert huggingface_hub.constants.HF_HUB_OFFLINE

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
