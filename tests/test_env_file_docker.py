"""docker's reading of `service.env_file` (`docker run --env-file`) as kerneldev models it,
checked line by line against what the docker CLI itself sends (where a `docker` CLI is
installed: tests/docker_cli.py), and the warnings a user sees where docker reads a line
otherwise than a shell."""

from __future__ import annotations

import pytest

from kerneldev.service.envfile import (
    FROM_DOCKER_ENV,
    _physical_lines,
    docker_reading,
    parse_env_file,
)
from tests.docker_cli import DOCKER, EnvRecorder

# (file bytes, docker's `Env` or the start of its refusal). The facts of cli/opts/envfile.go:
# a UTF-8 BOM dropped from the first line, one CR dropped from a line's end, Go's whitespace
# (not \x1c-\x1f) trimmed from its start, only a space or a tab refused in a name, a name
# alone taken from docker's own environment, invalid UTF-8 or a line of 64 KiB refused.
CASES = {
    "plain": (b"A=1\nB=x y # not a comment\n", ["A=1", "B=x y # not a comment"]),
    "quotes kept": (b"A=\"q u\"\nB='v'\n", ['A="q u"', "B='v'"]),
    "bom": ("\ufeffA=1\n".encode(), ["A=1"]),
    "crlf": (b"A=1\r\n", ["A=1"]),
    "one cr only": (b"A=1\r\r\n", ["A=1\r"]),
    "cr inside": (b"A=1\rB=2\n", ["A=1\rB=2"]),
    "leading blanks": (b"\t A=1\n\x0bB=2\n\xc2\xa0C=3\n", ["A=1", "B=2", "C=3"]),
    "x1c is not space": (b"\x1cA=1\n", ["\x1cA=1"]),
    "vt in a name": (b"A\x0bB=1\n", ["A\x0bB=1"]),
    "comments, blanks": (b"# c\n   \n  # d\nA=\n", ["A="]),
    "no final newline": (b"A=1", ["A=1"]),
    "name alone, set": (b"KD_SET\n", ["KD_SET=from-docker-env"]),
    "name alone, unset": (b"KD_UNSET\nA=1\n", ["A=1"]),
    "space in a name": (b"A =1\n", "variable 'A ' contains whitespaces"),
    "export": (b"export A=1\n", "variable 'export A' contains whitespaces"),
    "no name": (b"=1\n", "no variable name"),
    "invalid utf-8": (b"A=\xff\n", "invalid utf8 bytes"),
    "64 KiB line": (b"A=" + b"x" * 65534 + b"\n", "bufio.Scanner: token too long"),
    "64 KiB - 1": (b"A=" + b"x" * 65533 + b"\n", ["A=" + "x" * 65533]),
}
DOCKER_ENV = {"KD_SET": "from-docker-env"}


def _modelled(data: bytes) -> list[str] | str:
    """kerneldev's model of docker's reading of the file (read as kerneldev reads it)."""
    taken, refused = docker_reading(_physical_lines(data.decode("utf-8", "replace")))
    if refused is not None:
        return refused
    env = []
    for ops in taken:
        for key, value in ops:
            if value is FROM_DOCKER_ENV:
                if key in DOCKER_ENV:
                    env.append(f"{key}={DOCKER_ENV[key]}")
            else:
                env.append(f"{key}={value}")
    return env


@pytest.mark.parametrize("name", list(CASES))
def test_docker_reading_follows_its_reader(name):
    data, expected = CASES[name]
    got = _modelled(data)
    if isinstance(expected, str):
        assert isinstance(got, str) and expected in got, got
    else:
        assert got == expected


@pytest.mark.skipif(DOCKER is None, reason="no docker CLI installed")
def test_docker_reading_is_what_the_docker_cli_sends(tmp_path):
    path = tmp_path / "svc.env"
    with EnvRecorder() as docker:
        for name, (data, expected) in CASES.items():
            path.write_bytes(data)
            sent = docker.env_of(path, DOCKER_ENV)
            if isinstance(expected, str):
                assert isinstance(sent, str) and expected in sent, (name, sent)
            else:
                assert sent == expected, name


def test_a_name_alone_is_warned_about_and_not_a_key_the_line_sets():
    parsed = parse_env_file("SGLANG_SM120_MMA_FLASHMLA\nA=1\n")
    assert dict(parsed) == {"A": "1"}
    (warning,) = parsed.warnings
    assert "docker's --env-file: SGLANG_SM120_MMA_FLASHMLA from the environment docker runs in" in (
        warning
    )
    assert parsed.lines[0].keys == []


def test_a_bom_first_line_is_read_by_docker_alone_and_said():
    parsed = parse_env_file("\ufeffSGLANG_SM120_MMA_FLASHMLA=1\n")
    assert dict(parsed) == {}  # a shell runs it as a command; systemd ignores it
    (warning,) = parsed.warnings
    assert "docker's --env-file: SGLANG_SM120_MMA_FLASHMLA=1" in warning
