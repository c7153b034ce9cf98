"""keep_freed_memory: glibc malloc keeps freed buffers for reuse, unless the user chose otherwise."""

import platform

import pytest

GLIBC = platform.libc_ver()[0] == "glibc"


@pytest.fixture
def fresh(monkeypatch):
    from pofe.training import allocator

    for k in allocator._ENV + ("POFE_MALLOC_TUNING", "LD_PRELOAD"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(allocator, "_applied", None)
    return allocator


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's; other C libraries are left alone by design")
def test_applied_once_on_glibc(fresh, monkeypatch):
    assert fresh.keep_freed_memory() is True
    monkeypatch.setenv("POFE_MALLOC_TUNING", "0")
    assert fresh.keep_freed_memory() is True  # once per process: the first answer stands


@pytest.mark.parametrize("env", [{"POFE_MALLOC_TUNING": "0"}, {"MALLOC_TRIM_THRESHOLD_": "1048576"},
                                 {"MALLOC_MMAP_THRESHOLD_": "65536"}, {"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}])
def test_the_users_choice_is_left_alone(fresh, monkeypatch, env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert fresh.keep_freed_memory() is False


def test_the_onednn_primitive_cache_is_bounded_unless_the_user_set_it(monkeypatch):
    from pofe.training import allocator

    for k in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY"):
        monkeypatch.delenv(k, raising=False)
    assert allocator.bound_primitive_cache() is True
    assert allocator.PRIMITIVE_CACHE == 16 and __import__("os").environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "16"
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "256")
    assert allocator.bound_primitive_cache() is False
    assert __import__("os").environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "256"  # the user's value stands
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY")
    monkeypatch.setenv("DNNL_PRIMITIVE_CACHE_CAPACITY", "8")  # oneDNN's older name counts as the user's choice
    assert allocator.bound_primitive_cache() is False and "ONEDNN_PRIMITIVE_CACHE_CAPACITY" not in __import__("os").environ
