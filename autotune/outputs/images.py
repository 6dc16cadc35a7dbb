"""Docker image references as the exports write them: a tag checked against Docker's grammar, an image
split into the Helm chart's repository and tag, and an image given another tag."""

from __future__ import annotations

import re

from autotune.core.errors import AutotuneError

_IMAGE_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")  # Docker's grammar of a tag


def image_tag(value: str, what: str = "--tag") -> str:
    """A Docker image tag (up to 128 letters, digits, '_', '.' and '-', not first); AutotuneError
    otherwise: `docker run` would refuse the image, or a space would split it into two arguments."""
    if not _IMAGE_TAG.fullmatch(value):
        raise AutotuneError(f"{what} {value!r} is not a Docker image tag (e.g. v0.11.0)")
    return value


def split_image(image: str) -> tuple[str, str]:
    """ "repo/name:tag" -> ("repo/name", "tag"); no tag -> "latest" (a registry port is not a tag)."""
    head, sep, tag = image.rpartition(":")
    if not sep or "/" in tag:
        return image, "latest"
    return head, tag


def retag(image: str, tag: str) -> str:
    """`image` with `tag` for its tag: "my/vllm:tuned" -> "my/vllm:TAG". A digest goes too: it pins the
    content of the old tag, and would win over the new one."""
    repository, _ = split_image(image.partition("@")[0])
    return f"{repository}:{tag}"
