"""Guarantee 8: bad input to ``vllm-probe`` is one clear line and a non-zero exit.

Every case runs in an empty directory with a command that would leave a ``STARTED``
file: after the error that file, a ``vllm-probe-runs`` directory or any other new
file must not exist (nothing started, no run directory), stderr is exactly one line
``vllm-probe...: error: ...`` and never a traceback.
"""

from __future__ import annotations

import os

import pytest

from tests.conftest import run_cli
from vllm_probe.cli import main

STARTS = ["sh", "-c", "touch STARTED"]

#: name -> (files to create {name: text or bytes}, argv, fragment expected in the error line)
CASES: dict[str, tuple[dict, list[str], str]] = {
    "malformed json": ({"s.json": '{"scheduler_probe": {'}, ["run", "--settings", "s.json", "--", *STARTS],
                       "s.json: not valid JSON"),
    "malformed yaml": ({"s.yaml": "scheduler_probe: [1, 2\n"}, ["run", "--settings", "s.yaml", "--", *STARTS],
                       "s.yaml: not valid YAML"),
    "malformed toml": ({"s.toml": "[scheduler_probe\n"}, ["run", "--settings", "s.toml", "--", *STARTS],
                       "s.toml: not valid TOML"),
    "deeply nested json": ({"s.json": "[" * 100_000}, ["run", "--settings", "s.json", "--", *STARTS],
                           "s.json: nested too deeply"),
    "missing settings": ({}, ["run", "--settings", "nope.json", "--", *STARTS], "nope.json: settings file not found"),
    "settings is a directory": ({"d/x": ""}, ["run", "--settings", "d", "--", *STARTS], "d: cannot read settings"),
    "settings not utf-8": ({"s.json": b"\xff\xfe{}"}, ["run", "--settings", "s.json", "--", *STARTS],
                           "s.json: cannot read settings"),
    "wrong type": ({"s.json": '{"scheduler_probe": {"log_preempt_events": "yes"}}'},
                   ["run", "--settings", "s.json", "--", *STARTS],
                   "scheduler_probe.log_preempt_events: expected true/false"),
    "wrong type (yaml date)": ({"s.yaml": "scheduler_probe:\n  log_preempt_events: 2024-01-01\n"},
                               ["run", "--settings", "s.yaml", "--", *STARTS],
                               "scheduler_probe.log_preempt_events: expected true/false, got \"2024-01-01\""),
    "wrong type (toml datetime)": ({"s.toml": "[scheduler_probe]\nqueue_capacity = 1979-05-27T07:32:00Z\n"},
                                   ["run", "--settings", "s.toml", "--", *STARTS],
                                   "scheduler_probe.queue_capacity: expected an integer"),
    "wrong top level": ({"s.json": "[1, 2]"}, ["run", "--settings", "s.json", "--", *STARTS],
                        "the top level must be an object"),
    "unknown key": ({"s.json": '{"schedular_probe": {}}'}, ["run", "--settings", "s.json", "--", *STARTS],
                    "unknown key 'schedular_probe'"),
    "unknown flag": ({"s.json": '{"scheduler_probe": {"log_preempt_event": true}}'},
                     ["run", "--settings", "s.json", "--", *STARTS], "unknown key 'scheduler_probe.log_preempt_event'"),
    "capacity zero": ({"s.json": '{"scheduler_probe": {"queue_capacity": 0}}'},
                      ["run", "--settings", "s.json", "--", *STARTS], "queue_capacity must be at least 1"),
    "out under a file": ({"afile": ""}, ["run", "--out", "afile/run", "--", *STARTS],
                         "cannot write to --out afile/run"),
    "out is a file": ({"afile": ""}, ["run", "--out", "afile", "--", *STARTS], "cannot write to --out afile"),
    "out not creatable": ({}, ["run", "--out", "/proc/vllm-probe-test/run", "--", *STARTS],
                          "cannot write to --out /proc/vllm-probe-test/run"),
    "out not empty": ({"full/x": ""}, ["run", "--out", "full", "--", *STARTS], "--out full is not empty"),
    "unknown command": ({}, ["no-such-command-7f3a", "arg"], "command not found: no-such-command-7f3a"),
    "unknown command after run": ({}, ["run", "--", "no-such-command-7f3a"], "command not found"),
    "command is a directory": ({"d/x": ""}, ["run", "--", "./d"], "command is not executable: ./d"),
    "command not executable": ({"script.sh": "#!/bin/sh\ntouch STARTED\n"}, ["run", "--", "./script.sh"],
                               "command is not executable: ./script.sh"),
    "script without #!": ({"+x script.sh": "touch STARTED\n"}, ["run", "--", "./script.sh"],
                          "text file without a #! line"),
    "bad interpreter": ({"+x script.sh": "#!/no/such/sh\ntouch STARTED\n"}, ["run", "--", "./script.sh"],
                        "bad interpreter '/no/such/sh'"),
    "empty command": ({}, ["run", "--"], "no command given"),
    "run without command": ({}, ["run"], "no command given"),
    "no arguments at all": ({}, [], "no command given"),
    "empty command name": ({}, [""], "command not found"),
    "unknown option": ({}, ["--frobnicate"], "unrecognized arguments: --frobnicate"),
    "unknown run option": ({}, ["run", "--frobnicate", "--", *STARTS], "unrecognized arguments"),
    "settings without value": ({}, ["run", "--settings"], "expected one argument"),
    "metrics port out of range": ({}, ["run", "--metrics-port", "70000", "--", *STARTS], "port must be 0..65535"),
    "metrics port not a number": ({}, ["run", "--metrics-port", "http", "--", *STARTS], "not a port number: 'http'"),
    "metrics host not ours": ({}, ["run", "--metrics-port", "0", "--metrics-host", "192.0.2.1", "--", *STARTS],
                              "cannot serve metrics on 192.0.2.1:0: Cannot assign requested address"),
    "metrics host without port": ({}, ["run", "--metrics-host", "0.0.0.0", "--", *STARTS],
                                  "--metrics-host needs --metrics-port"),
    "metrics with a bad command": ({}, ["run", "--metrics-port", "0", "--", "no-such-command-7f3a"],
                                   "command not found: no-such-command-7f3a"),
    "sidecar without port": ({}, ["metrics"], "the following arguments are required: --port"),
    "sidecar run dir missing": ({}, ["metrics", "nope", "--port", "0"], "run directory not found: nope"),
}


def _make_files(root, files: dict) -> None:
    for name, content in files.items():
        executable = name.startswith("+x ")
        path = root / name.removeprefix("+x ")
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        if executable:
            path.chmod(0o755)


def _tree(root) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def assert_one_line_error(rc, out: str, err: str, fragment: str) -> None:
    assert rc not in (0, None), (rc, err)
    assert "Traceback" not in err and "Traceback" not in out
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("vllm-probe") and ": error: " in lines[0], lines[0]
    assert fragment in lines[0], lines[0]
    assert out == ""


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_and_nothing_starts(name, tmp_path, monkeypatch, capsys):
    files, argv, fragment = CASES[name]
    _make_files(tmp_path, files)
    before = _tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    try:
        rc = main(list(argv))
    except SystemExit as e:  # argparse's own exits
        rc = e.code
    out, err = capsys.readouterr()
    assert_one_line_error(rc, out, err, fragment)
    assert _tree(tmp_path) == before  # no STARTED, no vllm-probe-runs/, no --out directory
    assert not os.path.exists("/proc/vllm-probe-test")


@pytest.mark.parametrize("argv", [["run", "--metrics-port", "{port}", "--", *STARTS],
                                  ["metrics", ".", "--port", "{port}"]], ids=["run", "sidecar"])
def test_metrics_port_in_use_is_one_line_before_anything_starts(argv, tmp_path, monkeypatch, capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.chdir(tmp_path)
        rc = main([a.format(port=port) for a in argv])
    out, err = capsys.readouterr()
    assert rc == 2
    assert_one_line_error(rc, out, err, f"cannot serve metrics on 127.0.0.1:{port}: Address already in use")
    assert _tree(tmp_path) == set()  # the command did not start; no run directory


def test_metrics_without_prometheus_client_is_one_line(tmp_path, monkeypatch, capsys):
    """prometheus_client is an extra (vllm-probe[metrics]): without it, one line naming it."""
    import sys

    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # `import prometheus_client` fails
    monkeypatch.delitem(sys.modules, "vllm_probe.exporters.prometheus", raising=False)
    monkeypatch.chdir(tmp_path)
    rc = main(["run", "--metrics-port", "0", "--", *STARTS])
    out, err = capsys.readouterr()
    assert rc == 2
    assert_one_line_error(rc, out, err, "install it with: pip install 'vllm-probe[metrics]'")
    assert _tree(tmp_path) == set()


def test_exit_codes_follow_shell_conventions(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--", "no-such-command-7f3a"]) == 127
    _make_files(tmp_path, {"+x s": "echo\n"})
    assert main(["run", "--", "./s"]) == 126
    assert main(["run", "--"]) == 2
    (tmp_path / "bad.json").write_text("{")
    assert main(["run", "--settings", "bad.json", "--", "true"]) == 2
    capsys.readouterr()


def test_a_file_the_kernel_refuses_is_one_line_and_recorded(tmp_path, monkeypatch, capsys):
    """An executable binary that is not a valid program passes the checks; the kernel
    refuses it at start (ENOEXEC): still one error line, exit 126, and meta.json of
    the run directory (created just before) says why."""
    import json

    _make_files(tmp_path, {"+x prog": b"\x7fELF\x02\x01\x01\x00garbage"})
    monkeypatch.chdir(tmp_path)
    rc = main(["run", "--out", "run", "--", "./prog"])
    _, err = capsys.readouterr()
    assert rc == 126 and "Traceback" not in err
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert errors == ["vllm-probe: error: cannot start ./prog: Exec format error"]
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["exit_code"] == 126 and "Exec format error" in meta["error"]


def test_run_dir_removed_while_the_command_runs(tmp_path):
    """The command's exit code wins; the lost meta.json is one warning line."""
    out = tmp_path / "run"
    proc = run_cli("run", "--out", str(out), "--", "sh", "-c", f"rm -rf '{out}'; exit 4")
    assert proc.returncode == 4
    assert "Traceback" not in proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert warnings == [f"vllm-probe: warning: cannot update {out}/meta.json: No such file or directory"]


def test_internal_error_is_one_line_unless_debugging(tmp_path, monkeypatch, capsys):
    import vllm_probe.cli.run as run_cmd

    def broken(args):
        raise RuntimeError("boom")

    monkeypatch.setattr(run_cmd, "main", broken)
    assert main(["run", "--", "true"]) == 1
    _, err = capsys.readouterr()
    assert err.strip() == ("vllm-probe: error: internal error (RuntimeError: boom); "
                           "set VLLMPROBE_DEBUG=1 for the traceback")
    monkeypatch.setenv("VLLMPROBE_DEBUG", "1")
    with pytest.raises(RuntimeError):
        main(["run", "--", "true"])


def test_console_script_prints_no_traceback(tmp_path):
    """The same through the real entry point (a separate interpreter)."""
    (tmp_path / "s.yaml").write_text("scheduler_probe:\n  log_preempt_events: 2024-01-01\n")
    for args, fragment in (
        (["run", "--settings", str(tmp_path / "s.yaml"), "--", *STARTS], "expected true/false"),
        (["--frobnicate"], "unrecognized arguments"),
        ([], "no command given"),
    ):
        proc = run_cli(*args, cwd=tmp_path)
        assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, fragment)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]


def test_help_still_works(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    assert "run" in capsys.readouterr().out


def test_run_dir_and_its_files_are_private(tmp_path):
    """Guarantee 9 for the directory `vllm-probe run` creates by default: 0700 / 0600."""
    import stat

    proc = run_cli("run", "--", "true", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = (tmp_path / "vllm-probe-runs").iterdir()
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    assert [(p.name, stat.S_IMODE(p.stat().st_mode)) for p in run_dir.iterdir()] == [("meta.json", 0o600)]
