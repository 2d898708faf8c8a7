"""Secrets out of engine command lines, environments, labels and log-derived settings.

Every launch command, environment, label set and startup argument SparkOps stores, shows, exports
or prints passes through here first, so one rule decides what is a secret:

- **Secret names** (environment variables, labels, flags, dict keys): the name is split into
  words on ``_ - . /`` and on camelCase humps; it is a secret when one word is a credential word
  (``key token secret password passwd pass pwd passphrase credential credentials auth
  authorization apikey dsn cookie``) or ends with a strong one (``…password``, ``…passwd``,
  ``…secret``, ``…token``, ``…apikey``, so ``DBPASSWORD`` and ``HFTOKEN`` count). Plurals and
  longer words are not credentials: ``MAX_NUM_BATCHED_TOKENS``, ``VLLM_MAX_TOKENS``,
  ``TOKENIZERS_PARALLELISM`` and ``--tokenizer`` stay readable, and neither is a unit (a word
  after ``per``: ``sparkops.prefill-bytes-per-token``). A secret name's whole value is masked.
- **Secret-shaped values**, whatever their name: ``sk-…`` (OpenAI-style keys), ``hf_…``
  (Hugging Face), ``ghp_…``/``gho_…``/``github_pat_…`` (GitHub), ``xox?-…`` (Slack),
  ``AKIA…`` (AWS access key ids), JWTs (``eyJ….eyJ….…``) and the credential after ``Bearer`` or
  ``Basic``.
- **Credentials inside URLs**: ``scheme://user:pw@host`` → ``scheme://user:••••••@host``, and the
  value of a secret-named query parameter or ``name=value`` pair (``?token=…``, ``api_key=…``,
  ``password=…`` in a libpq DSN).
- **Command lines**: the value of a secret-named flag, as ``--flag value`` or ``--flag=value``,
  also inside a ``sh -c "…"`` script.

Masking is idempotent (a masked text masks to itself) and keeps everything else as it was, so
the launch flags SparkOps reads (model, port, KV-cache size, …) parse the same from a masked
command line. Cost: a few regular-expression passes over each string; pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

MASK = "••••••"

_CREDENTIAL_WORDS = frozenset({
    "key", "token", "secret", "password", "passwd", "pass", "pwd", "passphrase", "credential",
    "credentials", "auth", "authorization", "apikey", "dsn", "cookie",
})
_CREDENTIAL_SUFFIXES = ("password", "passwd", "secret", "token", "apikey")
_WORD_SPLIT = re.compile(r"[_\-./\s]+|(?<=[a-z0-9])(?=[A-Z])")

_SHAPED = re.compile(
    r"\bsk-[A-Za-z0-9_\-]{8,}"
    r"|\bhf_[A-Za-z0-9]{16,}"
    r"|\bgh[pousr]_[A-Za-z0-9]{16,}"
    r"|\bgithub_pat_[A-Za-z0-9_]{16,}"
    r"|\bxox[abposr]-[A-Za-z0-9\-]{8,}"
    r"|\bAKIA[0-9A-Z]{16}\b"
    r"|\beyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]*"
)
_SCHEME_CREDENTIAL = re.compile(r"\b(Bearer|Basic|Token)(\s+)([A-Za-z0-9._~+/=\-]{8,})")
# userinfo with a password: scheme://user:password@host (the password may hold anything but '@'
# and whitespace; the last '@' before the host ends it)
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@]*:)([^\s@/]+)(@)")
# name=value pairs: query parameters, libpq DSNs, `KEY=value` inside a script
_PAIR = re.compile(r"(?<![\w\-])([A-Za-z_][\w.\-]*)(\s*=\s*)('[^']*'|\"[^\"]*\"|[^\s&;,'\"]+)")
# --flag value or --flag=value inside a text (a shell script)
_TEXT_FLAG = re.compile(r"(?<!\S)(--?[A-Za-z][\w\-]*)(=|\s+)('[^']*'|\"[^\"]*\"|[^\s\-'\"]\S*)")


def is_secret_name(name: str) -> bool:
    """Whether a variable, label, flag or key name says its value is a credential."""
    words = [word.lower() for word in _WORD_SPLIT.split(name.strip().lstrip("-")) if word]
    return any((word in _CREDENTIAL_WORDS or word.endswith(_CREDENTIAL_SUFFIXES))
               and (index == 0 or words[index - 1] != "per")  # a unit: bytes per token
               for index, word in enumerate(words))


def mask_text(text: str) -> str:
    """``text`` with every credential it holds replaced by :data:`MASK` (see the module's
    rules): URL passwords, secret ``name=value`` pairs, secret flags' values, and
    secret-shaped tokens."""
    if not text:
        return text
    masked = _URL_PASSWORD.sub(lambda m: m.group(1) + MASK + m.group(3), text)
    masked = _PAIR.sub(_mask_pair, masked)
    masked = _TEXT_FLAG.sub(_mask_flag_in_text, masked)
    masked = _SCHEME_CREDENTIAL.sub(lambda m: m.group(1) + m.group(2) + MASK, masked)
    return _SHAPED.sub(MASK, masked)


def _mask_pair(match: re.Match[str]) -> str:
    if not is_secret_name(match.group(1)) or match.group(3) == MASK:
        return match.group(0)
    return match.group(1) + match.group(2) + MASK


def _mask_flag_in_text(match: re.Match[str]) -> str:
    if not is_secret_name(match.group(1)):
        return match.group(0)
    return match.group(1) + match.group(2) + MASK


def mask_command(argv: Sequence[str]) -> list[str]:
    """A command line (one word per item) with secret flags' values and every credential in
    its words masked. Word boundaries are kept, so the command parses as before."""
    masked: list[str] = []
    mask_next = False
    for word in argv:
        if mask_next and not word.startswith("-"):
            masked.append(MASK)
            mask_next = False
            continue
        mask_next = False
        if word.startswith("-") and len(word) > 1 and not word[1:2].isdigit():
            name, separator, value = word.partition("=")
            if is_secret_name(name):
                if separator:
                    masked.append(f"{name}={MASK}")
                else:
                    masked.append(word)
                    mask_next = True
                continue
        masked.append(mask_text(word))
    return masked


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    """An environment (or label set): secret names' values hidden whole, credentials inside
    every other value masked."""
    return {name: MASK if is_secret_name(name) else mask_text(str(value))
            for name, value in env.items()}


def mask_data(value: Any) -> Any:
    """A JSON-like value (dicts, lists, strings, numbers) with secrets masked: the value of a
    secret-named key (unless it is a switch's True/False or None), and credentials in strings.
    Used for parsed launch flags and for the arguments vLLM logs at startup."""
    if isinstance(value, Mapping):
        return {key: _masked_item(str(key), item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [mask_data(item) for item in value]
    if isinstance(value, str):
        return mask_text(value)
    return value


def _masked_item(key: str, item: Any) -> Any:
    if not is_secret_name(key) or item is None or isinstance(item, bool):
        return mask_data(item)
    if isinstance(item, list | tuple):
        return [MASK for _ in item]
    return MASK
