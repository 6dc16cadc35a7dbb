"""Secrets never reach a log, the study or an export: the values of secret environment variables
(HF_TOKEN, *_API_KEY, *SECRET*, *PASSWORD*), of secret flags (--api-key, --hf-token, --token,
--password) and URL passwords are replaced by *** wherever server output or a command is kept."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

# scheme://user:password@host: the password runs from the user's ':' to the last '@' before a space, so
# a password with '/' or '@' in it is hidden whole (a path with an '@' in it is hidden too: better more).
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][\w+.-]*://[^/\s:@]*:)(?P<password>\S*?)(?=@[^\s@]*(?:\s|$))")
# ?password=... (libpq and SQLAlchemy take connection parameters in the query) and other secret parameters.
_SECRET_PARAM = re.compile(
    r"(?P<head>[?&](?:password|passwd|pwd|sslpassword|secret|token|access_token|api_key|apikey)=)"
    r"(?P<value>[^&#\s]*)",
    re.IGNORECASE,
)

# Environment variables whose values are secrets (HF_TOKEN, OPENAI_API_KEY, AWS_SECRET_ACCESS_KEY...).
_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
# Flags whose values are secrets: vLLM's --api-key, Hugging Face's --hf-token / --token, passwords.
# Not every flag with TOKEN in its name: --max-num-batched-tokens is what autotune tunes.
_SECRET_FLAG = re.compile(
    r"^--?(?:[\w-]*[-_])?(?:api[-_]key|hf[-_]token|token|auth[-_]token|secret|secret[-_]key|password|passwd)$",
    re.IGNORECASE,
)
# An environment assignment in a command (`env HF_TOKEN=... vllm serve`), a secret when its name is one.
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MIN_SECRET_CHARS = 6  # shorter values ("1", "true") would mask innocent text everywhere


def secret_values(env: Mapping[str, str] | None = None) -> list[str]:
    """Values of secret-named environment variables (HF_TOKEN, OPENAI_API_KEY, ...SECRET, ...PASSWORD)."""
    env = os.environ if env is None else env
    return [v for k, v in env.items() if _SECRET_NAME.search(k) and len(v) >= MIN_SECRET_CHARS]


def secret_args(args: Sequence[str]) -> list[str]:
    """Values of the known secret flags in a command line (`--api-key X`, `--hf-token=X`) and of its
    secret-named environment assignments (`env HF_TOKEN=X vllm serve`)."""
    values = []
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if _secret_assignment(name, eq):
            values += [inline] if len(inline) >= MIN_SECRET_CHARS else []
            continue
        if not _SECRET_FLAG.match(name):
            continue
        value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
        if len(value) >= MIN_SECRET_CHARS:
            values.append(value)
    return values


def scrub(text: str, env: Mapping[str, str] | None = None, secrets: Sequence[str] = ()) -> str:
    """`text` with secrets replaced by ***: values of secret environment variables (of `env`, default
    this process's), the given `secrets` (e.g. `secret_args` of the server's command), and URL passwords."""
    for value in sorted({*secret_values(env), *secrets}, key=len, reverse=True):
        text = text.replace(value, "***")
    return masked(text)


def scrub_args(args: Sequence[str]) -> list[str]:
    """A command line with the values of known secret flags (--api-key X, --hf-token=X) hidden.

    Only flags that carry secrets are: `--max-num-batched-tokens 8192` is the flag autotune tunes.
    """
    out: list[str] = []
    hide_next = False
    for arg in args:
        name, eq, _ = arg.partition("=")
        if hide_next:
            out.append("***")
            hide_next = False
        elif _SECRET_FLAG.match(name):
            out.append(f"{name}=***" if eq else arg)
            hide_next = not eq
        elif _secret_assignment(name, eq):
            out.append(f"{name}=***")
        else:
            out.append(scrub(arg))
    return out


def _secret_assignment(name: str, eq: str) -> bool:
    """Whether `name=...` is an environment assignment of a secret-named variable (HF_TOKEN=...)."""
    return bool(eq) and bool(_ASSIGNMENT.match(name)) and bool(_SECRET_NAME.search(name))


def masked(text: str) -> str:
    """`text` with the password of every URL in it, and its secret query parameters, replaced by ***."""
    text = _URL_PASSWORD.sub(lambda m: m["head"] + "***" if m["password"] else m[0], text)
    return _SECRET_PARAM.sub(lambda m: m["head"] + "***" if m["value"] else m[0], text)


def without_password(url: str) -> str:
    """The URL without its password and secret query parameters (user@host stays)."""
    url = _URL_PASSWORD.sub(lambda m: m["head"][:-1], url)
    base, sep, query = url.partition("?")
    if not sep:
        return url
    kept = [p for p in query.split("&") if not _SECRET_PARAM.match("&" + p)]
    return base + ("?" + "&".join(kept) if kept else "")
