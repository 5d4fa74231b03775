"""load_format="dummy" (issue 31 item 4): random weights shaped by a folder's config.json, with the folder's
tokenizer and chat template; the bad inputs (an unknown load_format, a folder without config.json, a step
budget below one page or above the pool) are refused naming the value or file. CPU, tiny models."""
from __future__ import annotations

import os

import pytest

from radixkv import LLM, SamplingParams
from radixkv.cli import main
from radixkv.config import EngineConfig

from .conftest import CHATML, char_tokenizer
from .tiny_models import tiny_config

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def dummy_folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A model folder with config.json and a tokenizer (with a chat template), but no weights."""
    path = tmp_path_factory.mktemp("dummy-llama")
    config = tiny_config("llama")
    config.eos_token_id = 4  # <|im_end|>
    config.save_pretrained(path)
    for f in os.listdir(path):  # config.json only: a dummy load never reads weights
        assert f == "config.json" or not f.endswith((".safetensors", ".bin"))
    char_tokenizer(CHATML).save_pretrained(path)
    return str(path)


def test_dummy_load_streams_text_with_the_folders_tokenizer(dummy_folder: str) -> None:
    llm = LLM(dummy_folder, load_format="dummy", num_pages=64)
    assert llm.config.load_format == "dummy"
    out = llm.generate("hello there", GREEDY)[0]
    assert isinstance(out.text, str) and len(out.token_ids) == 6
    assert out.text == llm.get_tokenizer().decode(out.token_ids, skip_special_tokens=True)
    assert llm.get_tokenizer().chat_template == CHATML
    chat = llm.chat([{"role": "user", "content": "hi"}], GREEDY)[0]
    assert len(chat.token_ids) == 6 and isinstance(chat.text, str)


def test_dummy_weights_are_the_configs_seeded_random_weights(dummy_folder: str) -> None:
    """The same weights as LLM(config.json) with the same seed: the same greedy tokens."""
    dummy = LLM(dummy_folder, load_format="dummy", num_pages=64, seed=3)
    plain = LLM(os.path.join(dummy_folder, "config.json"), num_pages=64, seed=3)
    assert plain.tokenizer is None and dummy.tokenizer is not None
    prompt = [5, 17, 42, 9, 77, 31]
    assert dummy.generate([prompt], GREEDY)[0].token_ids == plain.generate([prompt], GREEDY)[0].token_ids


def test_dummy_of_a_config_json_path_takes_its_folders_tokenizer(dummy_folder: str) -> None:
    llm = LLM(os.path.join(dummy_folder, "config.json"), load_format="dummy", num_pages=64)
    assert llm.tokenizer is not None


def test_auto_on_a_folder_without_weights_still_needs_them(dummy_folder: str) -> None:
    with pytest.raises(FileNotFoundError, match="safetensors"):
        LLM(dummy_folder, num_pages=64)


@pytest.mark.parametrize("bad", ["pt", "DUMMY", "", 1])  # None: the default (vLLM port, engine_args.py)
def test_an_unknown_load_format_is_refused_naming_it_and_the_allowed_ones(dummy_folder: str, bad: object) -> None:
    with pytest.raises(ValueError, match=r"load_format .* is not supported; expected one of auto, dummy") as e:
        LLM(dummy_folder, load_format=bad, num_pages=64)
    assert repr(bad) in str(e.value)
    with pytest.raises(ValueError, match="load_format"):
        EngineConfig(load_format=bad)  # type: ignore[arg-type]


def test_dummy_on_a_folder_without_config_json_names_the_file(tmp_path) -> None:
    char_tokenizer(None).save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError) as e:
        LLM(str(tmp_path), load_format="dummy", num_pages=64)
    assert os.path.join(str(tmp_path), "config.json") in str(e.value)


def test_dummy_on_a_missing_folder_says_it_does_not_exist(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLM(str(tmp_path / "nowhere"), load_format="dummy", num_pages=64)


# ---------------------------------------------------------------------- the command line


def test_generate_with_load_format_dummy_prints_text(dummy_folder: str, capsys) -> None:
    code = main(["generate", dummy_folder, "hello", "--load-format", "dummy", "--device", "cpu", "--max-tokens", "4"])
    assert code == 0
    out = capsys.readouterr().out
    assert "'hello' -> '" in out and " tokens, 0 prompt tokens cached)" in out  # text, not token ids


def test_generate_with_a_bad_load_format_is_one_line(dummy_folder: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["generate", dummy_folder, "hello", "--load-format", "safetensors"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'safetensors'" in err and "auto, dummy" in err


def test_generate_dummy_without_config_json_is_one_line(tmp_path, capsys) -> None:
    char_tokenizer(None).save_pretrained(tmp_path)
    assert main(["generate", str(tmp_path), "hi", "--load-format", "dummy", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("radixkv: error:") and "config.json" in err


def test_bench_load_format_dummy_needs_a_model(capsys) -> None:
    assert main(["bench", "--load-format", "dummy", "--device", "cpu"]) == 2
    assert "--load-format dummy needs --model" in capsys.readouterr().err


def test_bench_with_load_format_dummy_runs(dummy_folder: str, capsys) -> None:
    assert main(["bench", "--model", dummy_folder, "--load-format", "dummy", "--device", "cpu", "--num-pages", "256",
                 "--shots", "1", "--prompts", "1", "--max-tokens", "2"]) == 0
    assert "greedy tokens identical" in capsys.readouterr().out


def test_serve_options_carry_load_format_and_refuse_a_bad_one(dummy_folder: str, tmp_path) -> None:
    from radixkv.cli import build_parser
    from radixkv.serve.cli_serve import llm_kwargs, resolve_options

    parser = build_parser()
    opts = resolve_options(parser.parse_args(["serve", dummy_folder, "--load-format", "dummy"]))
    assert llm_kwargs(opts)["load_format"] == "dummy"
    assert llm_kwargs(resolve_options(parser.parse_args(["serve", dummy_folder])))["load_format"] == "auto"
    with pytest.raises(ValueError, match="'npz' is not supported; expected one of auto, dummy"):
        resolve_options(parser.parse_args(["serve", dummy_folder, "--load-format", "npz"]))
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("load-format: bogus\n")
    with pytest.raises(ValueError, match="'bogus'"):
        resolve_options(parser.parse_args(["serve", dummy_folder, "--config", str(cfg)]))


# ---------------------------------------------------------------------- the step budget (bad input)


def test_a_budget_below_one_page_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"max_batch_tokens \(max_num_batched_tokens\) 8 is smaller than one page"):
        LLM(tiny_config("llama"), page_size=16, max_num_batched_tokens=8, num_pages=64)
    EngineConfig.from_kwargs(page_size=4, max_num_batched_tokens=4)  # one page is enough


def test_a_budget_larger_than_a_given_pool_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"max_batch_tokens \(max_num_batched_tokens\) 2048 is larger than the KV "
                                         r"pool: 64 pages x 16 tokens = 1024 tokens"):
        LLM(tiny_config("llama"), num_pages=64, max_num_batched_tokens=2048)


def test_a_budget_larger_than_a_sized_pool_is_refused_once_the_pool_is_sized() -> None:
    llm = LLM(tiny_config("llama"), num_pages=64)  # the default budget (8192) is simply capped by a small pool
    assert llm.config.scheduler.max_batch_tokens > 64 * 16
    sized = LLM(tiny_config("llama")).num_pages  # the pool the CPU sizes by default
    with pytest.raises(ValueError, match="is larger than the KV pool"):
        LLM(tiny_config("llama"), max_num_batched_tokens=sized * 16 + 1)


def test_the_servers_core_process_loads_dummy_weights_and_warms_up(dummy_folder: str) -> None:
    """`radixkv serve --load-format dummy`'s engine: the core process loads the dummy weights and warms up
    (forced on here) before it reports ready; its tokenizer streams text; outputs equal the offline engine's."""
    import asyncio

    from radixkv.serve.async_engine import AsyncLLM

    kw = {"load_format": "dummy", "device": "cpu", "num_pages": 64, "max_num_seqs": 4}
    want = LLM(dummy_folder, **kw).generate("hello", GREEDY)[0]
    engine = AsyncLLM.start(dummy_folder, warmup=True, log_interval_s=None, log_level="warning", **kw)
    try:
        assert engine.tokenizer is not None and engine.tokenizer.chat_template == CHATML

        async def run():
            stream = await engine.add_request("hello", GREEDY)
            return await stream.final()

        got = asyncio.run(run())
        assert got.token_ids == want.token_ids and got.text == want.text
        s = engine.engine_stats
        assert s is None or s.num_steps <= 1 + len(want.token_ids)  # the warm-up's steps are not counted
    finally:
        engine.shutdown()
