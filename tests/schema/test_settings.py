"""settings.json / YAML / TOML: flags, and errors that name the file and the key."""

from __future__ import annotations

import json
import sys

import pytest

from vllm_probe.settings import ProbeFlags, SettingsError, load_settings

ROOT_CONFIGS = __import__("pathlib").Path(__file__).resolve().parents[2] / "configs"


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_seed_settings_file_loads_with_its_flags():
    s = load_settings(ROOT_CONFIGS / "settings.json")
    assert s.flags == ProbeFlags(True, True, True)
    assert s.model == "facebook/opt-125m"
    assert s.sampling == {"temperature": 0.8, "top_p": 0.95, "max_tokens": 256}


def test_yaml_and_toml_give_the_same_flags(tmp_path):
    y = write(tmp_path, "s.yaml", "scheduler_probe:\n  log_schedule_each_step: false\n  queue_capacity: 10\n")
    t = write(tmp_path, "s.toml", "[scheduler_probe]\nlog_schedule_each_step = false\nqueue_capacity = 10\n")
    expected = ProbeFlags(log_schedule_each_step=False, queue_capacity=10)
    assert load_settings(y).flags == expected
    assert load_settings(t).flags == expected
    assert load_settings(ROOT_CONFIGS / "settings.minimal.yaml").flags == ProbeFlags(log_schedule_each_step=False)


def test_defaults_without_a_file():
    assert load_settings(None).flags == ProbeFlags()
    assert load_settings(None).flags.log_chunk_boundaries is True


@pytest.mark.parametrize("text,fragment", [
    ('{"scheduler_probe": {"log_preempt_event": true}}', "unknown key 'scheduler_probe.log_preempt_event'"),
    ('{"scheduler_probe": {"log_preempt_events": "yes"}}',
     'scheduler_probe.log_preempt_events: expected true/false, got "yes"'),
    ('{"scheduler_probe": {"queue_capacity": true}}', "scheduler_probe.queue_capacity: expected an integer, got true"),
    ('{"scheduler_probe": {"queue_capacity": 0}}', "queue_capacity must be at least 1"),
    ('{"sampling": {"max_tokens": 1.5}}', "sampling.max_tokens: expected an integer, got 1.5"),
    ('{"schedular_probe": {}}', "unknown key 'schedular_probe' (did you mean 'scheduler_probe'?)"),
    ('{"scheduler_probe": []}', "scheduler_probe: expected an object"),
    ('[1, 2]', "the top level must be an object"),
    ('{"scheduler_probe": {', "not valid JSON"),
])
def test_errors_name_file_and_key(tmp_path, text, fragment):
    p = write(tmp_path, "settings.json", text)
    with pytest.raises(SettingsError) as e:
        load_settings(p)
    msg = str(e.value)
    assert msg.startswith(str(p))
    assert fragment in msg
    assert "\n" not in msg


def test_missing_file_is_a_settings_error(tmp_path):
    with pytest.raises(SettingsError, match="settings file not found"):
        load_settings(tmp_path / "nope.json")


def test_flags_round_trip_to_dict():
    f = ProbeFlags(log_chunk_boundaries=False)
    assert ProbeFlags(**json.loads(json.dumps(f.to_dict()))) == f


@pytest.mark.parametrize("data,message", [
    ([1, 2], "the top level must be an object, got list"),
    ({1: 2}, "unknown key 1 (known: model, sampling, scheduler_probe, scheduler)"),
    ({"model": None}, "model: expected a string, got null"),
    ({"sampling": {"x": 1}}, "unknown key 'sampling.x' (known: temperature, top_p, max_tokens, seed)"),
    ({"sampling": {"temperature": True}}, "sampling.temperature: expected an integer or a number, got true"),
    ({"scheduler_probe": "x"}, 'scheduler_probe: expected an object, got "x"'),
    ({"scheduler_probe": {1: True}}, "unknown key 'scheduler_probe.1' (known: log_schedule_each_step, "
     "log_preempt_events, log_chunk_boundaries, log_request_events, log_block_digests, queue_capacity, "
     "max_segment_mb, rotate_every_s, compress_segments, keep_mb, keep_hours)"),
    ({"scheduler_probe": {"max_segment_mb": -1}}, "scheduler_probe.max_segment_mb must be at least 0"),
    ({"scheduler_probe": {"keep_hours": 0}}, "scheduler_probe.keep_hours must be above 0"),
    ({"scheduler_probe": {"keep_mb": "1"}}, 'scheduler_probe.keep_mb: expected a number or null, got "1"'),
    ({"scheduler_probe": {"log_preempt_events": None}},
     "scheduler_probe.log_preempt_events: expected true/false, got null"),
    ({"scheduler_probe": {"queue_capacity": 1.0}}, "scheduler_probe.queue_capacity: expected an integer, got 1.0"),
    ({"scheduler_probe": {"queue_capacity": -5}}, "scheduler_probe.queue_capacity must be at least 1"),
    ({"scheduler_probe": {"queue_capacity": {"a": 1}}},
     'scheduler_probe.queue_capacity: expected an integer, got {"a": 1}'),
])
def test_msgspec_errors_read_as_one_line_naming_the_key(data, message):
    """msgspec.convert checks the file against the Structs; its errors are rewritten to
    the messages the hand-written checks gave (same words, same key paths)."""
    from vllm_probe.settings import parse_settings

    with pytest.raises(SettingsError) as e:
        parse_settings(data, "f.json")
    assert str(e.value) == f"f.json: {message}"


def test_sampling_and_model_are_returned_as_written():
    from vllm_probe.settings import parse_settings

    s = parse_settings({"model": "", "sampling": {"top_p": 1, "seed": 3}}, "f.json")
    assert (s.model, s.sampling, s.flags) == ("", {"top_p": 1, "seed": 3}, ProbeFlags())


SEED_SETTINGS_JSON = (  # the seed notes' settings.json, verbatim (§2)
    '{ "model": "facebook/opt-125m", "sampling": { "temperature": 0.8, "top_p": 0.95, "max_tokens": 256 }, '
    '"scheduler_probe": { "log_schedule_each_step": true, "log_preempt_events": true, "log_chunk_boundaries": true }, '
    '"taotoken": { "api_key_env": "TAOTOKEN_API_KEY", "console_ref": "https://taotoken.net/api" } }')
SEED_CONFIG_TOML = """# config.toml - 本地推理 + 统一 Key 接入骨架
[server]
host = "0.0.0.0"
port = 8000
# vLLM OpenAI 兼容服务的基础地址
base_url = "http://127.0.0.1:8000/v1"

[taotoken]
# 统一 Key，从控制台获取后填入环境变量更安全
api_key_env = "TAOTOKEN_API_KEY"
chat_endpoint = "https://taotoken.net/api"
doc_ref = "https://taotoken.net/api"

[scheduler]
# 调度核心参数，下面会逐个解释
max_num_batched_tokens = 8192
max_num_seqs = 64
enable_chunked_prefill = true
gpu_memory_utilization = 0.90
preemption_mode = "recompute"
"""


def test_the_seed_files_are_read_as_written(tmp_path):
    s = load_settings(write(tmp_path, "settings.json", SEED_SETTINGS_JSON))
    assert s.flags == ProbeFlags() and s.ignored == ("taotoken",)
    assert (s.expected.model, s.expected.sampling, s.expected.engine) == \
        ("facebook/opt-125m", {"temperature": 0.8, "top_p": 0.95, "max_tokens": 256}, {})
    c = load_settings(write(tmp_path, "config.toml", SEED_CONFIG_TOML))
    assert c.flags == ProbeFlags() and c.ignored == ("server", "taotoken")
    assert c.expected.engine == {"max_num_batched_tokens": 8192, "max_num_seqs": 64, "enable_chunked_prefill": True,
                                 "gpu_memory_utilization": 0.9, "preemption_mode": "recompute"}
    assert load_settings(ROOT_CONFIGS / "config.toml").expected.engine["max_num_seqs"] == 64


def test_expected_settings_from_each_kind_of_file(tmp_path):
    from vllm_probe.settings import load_expected

    assert load_expected(write(tmp_path, "config.toml", SEED_CONFIG_TOML)).engine["max_num_batched_tokens"] == 8192
    args = load_expected(write(tmp_path, "args.yaml", "max-num-seqs: 8\nmax_num_batched_tokens: 512\nmodel: m\n"))
    assert (args.engine, args.model) == ({"max_num_seqs": 8, "max_num_batched_tokens": 512}, "m")
    with pytest.raises(SettingsError, match="top level must be an object"):
        load_expected(write(tmp_path, "l.yaml", "- 1\n"))


def test_a_file_of_comments_only_is_said_to_hold_nothing(tmp_path):
    """The seed notes' config.toml is one line starting with ``#`` when copied verbatim:
    accepted, and said to hold nothing (by run and by doctor --expect)."""
    from tests.conftest import ROOT, run_cli

    f = tmp_path / "config.toml"
    f.write_text("# [scheduler] max_num_batched_tokens = 8192   max_num_seqs = 64\n")
    assert load_settings(f).empty and not load_settings(f).expected
    r = run_cli("run", "--settings", str(f), "--out", str(tmp_path / "run"), "--", sys.executable, "-c", "pass")
    assert r.returncode == 0
    assert f"vllm-probe: {f}: no settings in it (every line a comment or blank)" in r.stderr
    assert not load_settings(ROOT / "configs" / "config.toml").empty


# -- issue 20 item 7: a BOM, an empty file; issue 17 item 7: a wrong type ------------------

FLAGS_OFF = {".json": '{"scheduler_probe": {"log_schedule_each_step": false}}\n',
             ".yaml": "scheduler_probe:\n  log_schedule_each_step: false\n",
             ".toml": "[scheduler_probe]\nlog_schedule_each_step = false\n"}


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".toml"])
def test_a_utf8_bom_is_accepted_in_every_format(tmp_path, suffix):
    p = tmp_path / f"settings{suffix}"
    p.write_bytes(b"\xef\xbb\xbf" + FLAGS_OFF[suffix].encode())  # what Windows editors write
    s = load_settings(p)
    assert s.flags.log_schedule_each_step is False and s.flags.log_preempt_events is True and not s.empty


@pytest.mark.parametrize("suffix", [".json", ".yaml", ".toml"])
@pytest.mark.parametrize("text", ["", "\n  \n", "\ufeff"])
def test_an_empty_file_means_the_defaults_in_every_format(tmp_path, suffix, text):
    from vllm_probe.settings import load_expected

    p = tmp_path / f"settings{suffix}"
    p.write_text(text, encoding="utf-8")
    s = load_settings(p)
    assert s.empty and s.flags == ProbeFlags() and s.expected is None
    assert load_expected(p).is_empty()


@pytest.mark.parametrize("name,text,fragment", [
    ("config.toml", '[scheduler]\nmax_num_batched_tokens = "8k"\n',
     'scheduler.max_num_batched_tokens: expected an integer (vLLM\'s engine argument), got "8k"'),
    ("config.toml", "[scheduler]\nmax_num_seqs = true\n", "scheduler.max_num_seqs: expected an integer"),
    ("config.toml", '[scheduler]\nenable_chunked_prefill = "yes"\n',
     'scheduler.enable_chunked_prefill: expected true/false (vLLM\'s engine argument), got "yes"'),
    ("args.yaml", "max-num-batched-tokens: 8k\n", 'max_num_batched_tokens: expected an integer (vLLM\'s engine '
                                                    'argument), got "8k"'),
])
def test_an_engine_argument_of_the_wrong_type_is_refused(tmp_path, name, text, fragment):
    from vllm_probe.settings import load_expected

    p = write(tmp_path, name, text)
    with pytest.raises(SettingsError) as e:
        load_expected(p)
    assert str(e.value).startswith(str(p)) and fragment in str(e.value) and "\n" not in str(e.value)
    if name.endswith(".toml"):
        with pytest.raises(SettingsError, match="expected"):
            load_settings(p)


def test_right_types_pass_an_int_is_a_number_and_unknown_names_are_not_type_checked(tmp_path):
    from vllm_probe.settings import load_expected

    p = write(tmp_path, "config.toml", "[scheduler]\ngpu_memory_utilization = 1\nmax_num_batched_token = \"2k\"\n"
                                       "scheduling_policy = \"priority\"\n")
    assert load_expected(p).engine == {"gpu_memory_utilization": 1, "max_num_batched_token": "2k",
                                       "scheduling_policy": "priority"}


def test_the_minimal_settings_file_says_what_it_does():
    """Issue 20 item 7: it said "Same flags as settings.json" but turns step events off."""
    text = (ROOT_CONFIGS / "settings.minimal.yaml").read_text()
    assert "Same flags as settings.json" not in text
    assert "turns per-step `step` events off" in text
    assert load_settings(ROOT_CONFIGS / "settings.minimal.yaml").flags == ProbeFlags(log_schedule_each_step=False)
    assert load_settings(ROOT_CONFIGS / "settings.json").flags == ProbeFlags()


def test_the_license_is_an_spdx_expression_so_setuptools_prints_no_deprecation():
    """Issue 20 item 7: ``license = { text = ... }`` made setuptools >= 77 print its
    deprecation block during ``make demo``'s install; an SPDX string needs setuptools >= 77."""
    import tomllib

    project = tomllib.loads((ROOT_CONFIGS.parent / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert project["build-system"]["requires"] == ["setuptools>=77"]
    assert not [c for c in project["project"].get("classifiers", []) if c.startswith("License ::")]


def test_docs_settings_table_is_the_generated_vocabulary():
    """docs/whatif.md's settings table is :func:`vllm_probe.schema.engine_settings.reference`."""
    from pathlib import Path

    from vllm_probe.schema.engine_settings import reference

    text = (Path(__file__).resolve().parents[2] / "docs" / "whatif.md").read_text()
    begin = text.index("<!-- settings table: generated by")
    begin = text.index("\n", begin) + 1
    assert text[begin:text.index("<!-- end of the settings table -->")] == reference()


def test_the_vocabulary_names_each_setting_its_engine_argument_and_flag():
    from vllm_probe.schema.engine_settings import BY_NAME, engine_kwargs, serve_flags

    assert BY_NAME["num_kv_blocks"].engine_arg == "num_gpu_blocks_override"
    assert serve_flags({"num_kv_blocks": 80, "async_scheduling": False, "enable_prefix_caching": True}) == [
        "--num-gpu-blocks-override", "80", "--no-async-scheduling", "--enable-prefix-caching"]
    assert engine_kwargs({"num_kv_blocks": 80, "scheduling_policy": "priority"}) == (
        "num_gpu_blocks_override=80, scheduling_policy='priority'")
    assert BY_NAME["watermark"].out_of_bounds(1.0) == "watermark=1.0: a share of KV blocks in [0, 1)"
    assert BY_NAME["watermark"].out_of_bounds(0.0) is None
