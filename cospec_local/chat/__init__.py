"""The chat surface: what turns messages into a prompt and a reply into messages.

- template.py: a model's chat template (untrusted Jinja) in a sandboxed renderer;
  template_process.py: that renderer in a child process with hard limits;
- session.py and display.py: `cospec-local chat`, the terminal conversation;
- tool_calls.py: tools through the template, calls read back from the reply;
- openai_format.py: a reply in OpenAI's shapes (logprobs, tool calls, streamed calls, usage);
- engine_chat.py: chat on an Engine (its templates, tools, OpenAI-style chat completions).
"""
