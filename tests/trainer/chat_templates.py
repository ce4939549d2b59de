"""Chat templates written for the tests that behave as three families' own do, checked against
the templates the models ship (as TRL keeps copies of them for identity checks,
huggingface/trl ``trl/chat_templates/qwen3.jinja``, ``llama3.jinja``, ``mistral.jinja``): not
copies, but the same rendering rules for the roles these tests use.

- Qwen3-like: ChatML turns (``<|im_start|>ROLE\\n ... <|im_end|>\\n``); an assistant message's
  ``<think>...</think>`` reasoning is split off its answer, and rendered (as ``<think>\\n R
  \\n</think>\\n\\n`` before the answer, empty when there is none) only for assistant turns
  after the last user message that are the last message or have reasoning; every earlier turn
  is its answer alone. Generation prompt ``<|im_start|>assistant\\n``.
- Llama 3-like: ``<|begin_of_text|>`` (the BOS) first, then per message
  ``<|start_header_id|>ROLE<|end_header_id|>\\n\\n`` + the trimmed content + ``<|eot_id|>``;
  generation prompt ``<|start_header_id|>assistant<|end_header_id|>\\n\\n``.
- Mistral-like: BOS, an optional leading system message rendered only into the last message
  when that is a user message (``[INST] SYSTEM\\n\\nUSER[/INST]``), other user messages
  ``[INST] USER[/INST]``, an assistant message `` `` + trimmed content + EOS; roles after the
  system message must alternate user/assistant (raise_exception otherwise); no generation
  prompt.
"""

QWEN3_LIKE = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role != 'assistant' %}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{%- set answer = m.content %}{%- set reasoning = '' %}"
    "{%- if '</think>' in m.content %}"
    "{%- set reasoning = m.content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}"
    "{%- set answer = m.content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if loop.index0 > ns.last_user and (loop.last or reasoning) %}"
    "{{- '<think>\\n' + reasoning + '\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{{- answer + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

LLAMA3_LIKE = (
    "{{- bos_token }}"
    "{%- for m in messages %}"
    "{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + m.content | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

MISTRAL_LIKE = (
    "{%- if messages[0].role == 'system' %}{%- set system = messages[0].content %}"
    "{%- set rest = messages[1:] %}{%- else %}{%- set rest = messages %}{%- endif %}"
    "{%- for m in rest %}{%- if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('roles must alternate user/assistant after the system message') }}"
    "{%- endif %}{%- endfor %}"
    "{{- bos_token }}"
    "{%- for m in rest %}"
    "{%- if m.role == 'user' %}"
    "{%- if loop.last and system is defined %}"
    "{{- '[INST] ' + system + '\\n\\n' + m.content + '[/INST]' }}"
    "{%- else %}{{- '[INST] ' + m.content + '[/INST]' }}{%- endif %}"
    "{%- else %}{{- ' ' + m.content | trim + eos_token }}{%- endif %}"
    "{%- endfor %}"
)

# Generation prompts that open more than an assistant turn renders (rule 3 of trainer.chat_masks),
# as huggingface/trl v1.9.0 ``trl/chat_templates/deepseekv3.jinja`` and ``nemotron_3_nano.jinja``
# have them: DeepSeek-V3-like, user ``<|user|> `` + content, an assistant turn ``<|assistant|> ``
# + content + EOS, the generation prompt ``<|assistant|> <think> `` (a think block the turns never
# render); Nemotron 3-like, ChatML turns whose assistant turns render ``<think></think>`` before
# the answer, the generation prompt ``<|im_start|>assistant\n<think>\n``.
DEEPSEEK_LIKE = (
    "{{- bos_token }}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}{{- '<|assistant|> ' + m.content + ' ' + eos_token + ' ' }}"
    "{%- else %}{{- '<|' + m.role + '|> ' + m.content + ' ' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|> <think> ' }}{%- endif %}"
)

NEMOTRON3_LIKE = (
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n<think></think>' + m.content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)
