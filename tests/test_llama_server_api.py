"""llama-server's own API on a real server: /completion whole and streamed (read by a streaming
HTTP client, as llama-server's clients read it), /infill, /tokenize, /detokenize, /props, /slots,
the embeddings endpoints' 501, per-request speculation on every endpoint, and the header that names
fields read without effect."""
import json
import re
from pathlib import Path

import httpx
import pytest

from cospec_local.server.process import ServerProcess

PROMPT = "Mei has 94 stamps. She buys 3 more. How many stamps does Mei have now?"
GREEDY = {"temperature": 0, "arbiter": "target", "spec_type": "draft", "adaptive_draft": False}


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("-c", "512")  # the demo pair
    yield srv
    srv.stop()


def post(server, path, body, **kw):
    return httpx.post(server.url + path, json=body, timeout=120, **kw)


def test_completion_honours_n_predict_and_per_request_speculation(server):
    one = post(server, "/completion", {"prompt": PROMPT, "n_predict": 20, **GREEDY, "speculative.n_max": 1}).json()
    four = post(server, "/completion", {"prompt": PROMPT, "n_predict": 20, **GREEDY,
                                        "speculative": {"n_max": 4, "n_min": 4}}).json()
    off = post(server, "/completion", {"prompt": PROMPT, "n_predict": 20, **GREEDY, "speculative": False}).json()
    for answer in (one, four, off):
        assert answer["tokens_predicted"] == 20 and answer["stop"] is True and answer["stop_type"] == "limit"
    assert one["content"] == four["content"] == off["content"]  # lossless, whatever the blocks
    assert one["timings"]["blocks"] > 0 and one["timings"]["draft_n"] == one["timings"]["blocks"]
    assert four["timings"]["blocks"] > 0 and four["timings"]["draft_n"] == 4 * four["timings"]["blocks"]
    assert off["timings"]["draft_n"] == 0 and off["generation_settings"]["spec_type"] == "none"
    assert four["generation_settings"]["speculative.n_max"] == 4 and four["generation_settings"]["speculative.n_min"] == 4
    # max_tokens is n_predict; token ids as the prompt; the reply's ids and log-probabilities
    ids = post(server, "/tokenize", {"content": PROMPT, "add_special": True}).json()["tokens"]
    again = post(server, "/completion", {"prompt": ids, "max_tokens": 20, **GREEDY, "return_tokens": True,
                                         "n_probs": 2}).json()
    assert again["content"] == one["content"] and len(again["tokens"]) == 20
    probs = again["completion_probabilities"]
    assert [p["id"] for p in probs] == again["tokens"] and all(len(p["top_logprobs"]) == 2 for p in probs)


def test_a_streamed_completion_is_the_whole_one_in_pieces(server):
    whole = post(server, "/completion", {"prompt": PROMPT, "n_predict": 24, **GREEDY}).json()
    with httpx.stream("POST", server.url + "/completion", json={"prompt": PROMPT, "n_predict": 24, **GREEDY,
                                                                "stream": True}, timeout=120) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        chunks = [json.loads(line[len("data: "):]) for line in response.iter_lines() if line.startswith("data: ")]
    assert len(chunks) > 2 and all(c["stop"] is False for c in chunks[:-1])
    last = chunks[-1]
    assert last["stop"] is True and last["tokens_predicted"] == 24 and last["timings"]["predicted_n"] == 24
    assert "".join(c["content"] for c in chunks) == whole["content"]


def test_tokenize_and_detokenize_round_trip(server):
    tokens = post(server, "/tokenize", {"content": "94 + 3 = 97"}).json()["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens)
    assert post(server, "/detokenize", {"tokens": tokens}).json() == {"content": "94 + 3 = 97"}
    pieces = post(server, "/tokenize", {"content": "94 + 3 = 97", "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == tokens and "".join(p["piece"] for p in pieces).strip() == "94 + 3 = 97"
    bad = post(server, "/detokenize", {"tokens": [10**7]})
    assert bad.status_code == 400 and "outside the vocabulary" in bad.json()["error"]["message"]


def test_props_slots_and_what_is_not_served(server):
    props = httpx.get(server.url + "/props").json()
    assert props["default_generation_settings"]["n_ctx"] == 512 and props["total_slots"] == 1
    assert props["draft_model_path"]
    slots = httpx.get(server.url + "/slots").json()
    assert [s["id"] for s in slots] == [0] and slots[0]["alive"] is True
    for path in ("/embedding", "/embeddings", "/v1/embeddings"):
        answer = post(server, path, {"input": "x", "content": "x"})
        assert answer.status_code == 501 and "embeddings are not served" in answer.json()["error"]["message"]
    infill = post(server, "/infill", {"input_prefix": "def f(", "input_suffix": "):"})
    assert infill.status_code == 501 and "no fill-in-the-middle tokens" in infill.json()["error"]["message"]


def test_no_field_is_dropped_without_a_word(server):
    answer = post(server, "/completion", {"prompt": PROMPT, "n_predict": 2, "samplers": "edkypmxt", "id_slot": 0,
                                          "mystery": 1, "typical_p": 1.0, "mirostat": 0})
    assert answer.status_code == 200
    assert set(answer.headers["x-cospec-ignored"].split(", ")) == {"mystery", "samplers", "id_slot"}
    refused = post(server, "/completion", {"prompt": PROMPT, "mirostat": 2})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "mirostat"
    # the OpenAI endpoints: llama-server's fields honoured there too, unknown ones named
    chat = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}], "n_predict": 5,
                                                 "speculative.n_max": 2, "cache_prompt": True, **GREEDY})
    assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] == 5
    assert chat.headers["x-cospec-ignored"] == "cache_prompt"
    timings = chat.json()["timings"]
    assert timings["blocks"] == 0 or timings["draft_n"] <= 2 * timings["blocks"]
    text = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 20, **GREEDY,
                                            "speculative": {"n_max": 4, "n_min": 4}}).json()["timings"]
    assert text["blocks"] > 0 and text["draft_n"] == 4 * text["blocks"]
    bad = post(server, "/v1/completions", {"prompt": PROMPT, "speculative.n_min": 9})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "speculative.n_min"
    assert "speculative.n_min: must be in [0, 8]" in bad.json()["error"]["message"]


def test_infill_where_the_model_has_fim_tokens(tmp_path):
    """A SmolLM2 whose metadata names three of its tokens as FIM prefix, suffix and middle: /infill
    writes llama-server's prefix-suffix-middle prompt and completes after it."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from gguf_corpus import T, spliced_kv

    from cospec_local.models import resolve_model

    model = tmp_path / "fim.gguf"
    spliced_kv(Path(resolve_model("smollm2-135m")), tmp_path / "a.gguf", "tokenizer.ggml.fim_pre_token_id", 3, T.UINT32)
    spliced_kv(tmp_path / "a.gguf", tmp_path / "b.gguf", "tokenizer.ggml.fim_suf_token_id", 4, T.UINT32)
    spliced_kv(tmp_path / "b.gguf", model, "tokenizer.ggml.fim_mid_token_id", 5, T.UINT32)
    srv = ServerProcess("-m", model, "-c", "512")
    try:
        answer = post(srv, "/infill", {"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n",
                                       "input_extra": [{"filename": "util.py", "text": "x = 1"}], "n_predict": 6,
                                       "temperature": 0, "return_tokens": True})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["tokens_predicted"] == 6 and len(body["tokens"]) == 6
        prefix = post(srv, "/tokenize", {"content": "def add(a, b):\n    return ", "parse_special": False}).json()["tokens"]
        # prompt: <fim_pre> util.py\nx = 1 <prefix> <fim_suf> \n <fim_mid>
        assert body["tokens_evaluated"] >= len(prefix) + 4
    finally:
        srv.stop()


def test_the_field_table_is_the_code():
    from cospec_local.server.llama_api import LLAMA_FIELDS, LlamaCompletionRequest
    from cospec_local.server.protocol import APIError, known_fields, parse_request

    doc = (Path(__file__).resolve().parents[1] / "docs" / "serve.md").read_text()
    section = doc.split("| `/completion` field |")[1].split("\n\n")[0]
    listed = dict(re.findall(r"^\| `([\w.]+)` \| (\w+) \|", section, re.M))
    assert listed == LLAMA_FIELDS
    assert set(listed) <= known_fields(LlamaCompletionRequest)
    asks = {"typical_p": 0.5, "dynatemp_range": 0.5, "dynatemp_exponent": 2.0, "mirostat": 2, "mirostat_tau": 4.0,
            "mirostat_eta": 0.2, "dry_multiplier": 0.8, "dry_base": 2.0, "dry_allowed_length": 3,
            "dry_penalty_last_n": 64, "dry_sequence_breakers": ["\n"], "xtc_probability": 0.5, "xtc_threshold": 0.2,
            "presence_penalty": 0.5, "frequency_penalty": 0.5, "logit_bias": {"1": 5}, "n_indent": 4,
            "t_max_predict_ms": 100, "image_data": [{"data": "x"}], "multimodal_data": ["x"], "lora": [{"id": 0}],
            "post_sampling_probs": True}
    for field, status in listed.items():
        if status == "refused":
            body = {"prompt": "hi", field: asks[field]} | ({"dry_multiplier": 0.8} if field.startswith("dry_") else {})
            with pytest.raises(APIError) as e:
                parse_request(LlamaCompletionRequest, body, strict=False)
            assert e.value.status == 400 and e.value.param in (field, "dry_multiplier"), field
        elif status == "ignored":
            request = parse_request(LlamaCompletionRequest, {"prompt": "hi", field: 1 if field not in
                                    ("samplers", "response_fields") else ["x"]}, strict=True)
            assert request.ignored == [field]
