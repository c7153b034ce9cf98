"""keep_freed_memory: glibc malloc keeps freed buffers for reuse, unless the user chose otherwise."""

import platform

import pytest

GLIBC = platform.libc_ver()[0] == "glibc"


@pytest.fixture
def fresh(monkeypatch):
    from pofe.runtime import allocator

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
    from pofe.runtime import allocator

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


# -- tcmalloc preloaded by restarting a model command once (pofe.preload) ----------------------
LIB = "/opt/lib/libtcmalloc_minimal.so.4"


def test_a_model_command_restarts_with_tcmalloc_first_in_ld_preload_and_only_once():
    from pofe.preload import command_of, preload_env

    argv = ["-v", "online", "--config", "x.yaml"]
    assert command_of(argv) == "online"
    env = preload_env("online", argv, {"PATH": "/bin", "LD_PRELOAD": "/x/libgomp.so"}, lambda: LIB, platform="linux")
    assert env == {"PATH": "/bin", "LD_PRELOAD": f"{LIB}:/x/libgomp.so", "_POFE_TCMALLOC_RESTARTED": "1",
                   "TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": str(2**60)}
    assert preload_env("online", argv, {}, lambda: LIB, platform="linux")["LD_PRELOAD"] == LIB
    never = lambda: pytest.fail("looked for the library where nothing would use it")  # noqa: E731
    assert preload_env("online", argv, env, never, platform="linux") is None  # the restarted process goes on
    assert preload_env("online", argv, {"_POFE_TCMALLOC_RESTARTED": "1"}, never, platform="linux") is None
    assert preload_env("report", ["report"], {}, never, platform="linux") is None


@pytest.mark.parametrize("command, argv, environ, lib, plat", [
    ("online", ["online"], {}, None, "linux"),                                          # none installed
    ("online", ["online"], {}, LIB, "darwin"),                                          # not Linux
    ("report", ["report", "runs/x"], {}, LIB, "linux"),                                 # loads no model
    (None, [], {}, LIB, "linux"),                                                       # no command
    ("online", ["online", "--help"], {}, LIB, "linux"),                                 # help only
    ("online", ["online"], {"POFE_TCMALLOC": "0"}, LIB, "linux"),                       # the user's off switch
    ("online", ["online"], {"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, LIB, "linux"),  # another allocator
    ("online", ["online"], {"MALLOC_ARENA_MAX": "2"}, LIB, "linux"),                    # glibc tuned by the user
])
def test_no_restart_where_the_user_or_the_machine_decided_otherwise(command, argv, environ, lib, plat):
    from pofe.preload import preload_env

    assert preload_env(command, argv, environ, lambda: lib, platform=plat) is None


@pytest.mark.slow
def test_the_restarted_process_runs_on_tcmalloc():
    """A real restart: the child replaces itself (same PID) and maps the library."""
    import subprocess
    import sys

    from pofe.preload import tcmalloc_library

    if tcmalloc_library() is None:
        pytest.skip("no tcmalloc on this machine (apt-get install libtcmalloc-minimal4; .ci/run installs it)")
    code = ("import os\nfrom pofe.preload import restart_with_tcmalloc, allocator\nprint(os.getpid(), flush=True)\n"
            "restart_with_tcmalloc('online')\n"
            "print(os.getpid(), allocator(), 'tcmalloc' in open('/proc/self/maps').read())")
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("LD_PRELOAD", "POFE_TCMALLOC", "_POFE_TCMALLOC_RESTARTED") and not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env).stdout.split()
    # the PID printed before the restart, again by the restarted code, then with what it runs on
    assert len(out) == 5 and out[0] == out[1] == out[2], out
    assert "tcmalloc" in out[3] and out[4] == "True", out
