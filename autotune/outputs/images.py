"""Docker image references as the exports write them: an image and a tag checked against Docker's
grammar, an image split into the Helm chart's repository and tag, and an image given another tag."""

from __future__ import annotations

import re

from autotune.core.errors import AutotuneError

_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_IMAGE_TAG = re.compile(_TAG)  # Docker's grammar of a tag
# The rest of a reference, [domain[:port]/]path[:tag][@digest] (github.com/distribution/reference).
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[0-9a-fA-F:]+\])(?::[0-9]+)?"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(
    rf"(?P<name>(?:{_DOMAIN}/)?{_PATH_PART}(?:/{_PATH_PART})*)(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?"
)
NAME_CHARS = 255  # Docker's limit on a repository name


def image_tag(value: str, what: str = "--tag") -> str:
    """A Docker image tag (up to 128 letters, digits, '_', '.' and '-', not first); AutotuneError
    otherwise: `docker run` would refuse the image, or a space would split it into two arguments."""
    if not _IMAGE_TAG.fullmatch(value):
        raise AutotuneError(f"{what} {value!r} is not a Docker image tag (e.g. v0.11.0)")
    return value


def image_reference(value: str, what: str = "--image") -> str:
    """A Docker image reference, [registry[:port]/]repo[:tag][@digest]; AutotuneError otherwise: `docker
    run` and Kubernetes would refuse it, or a space would split it into two arguments."""
    _parse(value, what)
    return value


def _parse(image: str, what: str) -> re.Match[str]:
    """`image` matched by Docker's reference grammar (groups name, tag, digest); AutotuneError if not."""
    match = _REFERENCE.fullmatch(image)
    if match is None or len(match["name"]) > NAME_CHARS:
        raise AutotuneError(
            f"{what} {image!r} is not a Docker image reference ([registry/]repo[:tag][@digest], "
            "e.g. vllm/vllm-openai:v0.11.0)"
        )
    return match


def split_image(image: str) -> tuple[str, str]:
    """An image as the Helm chart's (repository, tag): "reg:5000/name:tag" -> ("reg:5000/name", "tag"),
    no tag -> "latest"; a digest stays on the tag ("tag@sha256:..."), which the chart joins with ':'."""
    match = _parse(image, "image")
    digest = f"@{match['digest']}" if match["digest"] else ""
    return match["name"], (match["tag"] or "latest") + digest


def retag(image: str, tag: str) -> str:
    """`image` with `tag` for its tag: "my/vllm:tuned" -> "my/vllm:TAG". A digest goes too: it pins the
    content of the old tag, and would win over the new one."""
    repository = split_image(image)[0]
    return f"{repository}:{tag}"
