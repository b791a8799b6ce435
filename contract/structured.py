"""A structured-output constraint: the one form every entry point maps onto and the engine enforces.

Exactly one kind is set, as in vLLM's ``structured_outputs``: ``json`` (a JSON schema), ``json_object``
(any JSON object), ``regex``, ``choice`` (one of fixed strings) or ``grammar`` (Lark, or llama.cpp's
GBNF). ``grammar_text`` turns it into llguidance's grammar; ``problem`` says why the library would
refuse it, so the API refuses it at submission: one that does not compile, one that can match no
text at all (its first step allows nothing: ``[^\\s\\S]``, ``start: start``, a ``$ref`` to itself),
which would otherwise end at once with empty output, and one the library gives up on along a short
walk. llguidance is imported lazily: ``contract/`` stays importable without it, and only a request
that carries a constraint needs it.

A ``choice`` is one regex alternation, a single lexeme: as a grammar rule of alternatives, each choice
is an item of the parser's row, and llguidance refuses a row of more than 2,000 items mid-output.
"""

from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from json import dumps
from typing import Any, ClassVar

# Compact JSON: without this a small model can fill max_tokens with whitespace between values.
JSON_OPTIONS = {"whitespace_flexible": False}
KINDS = ("json", "json_object", "regex", "choice", "grammar")
WALK_BYTES = 16  # how far ``problem`` follows a constraint looking for a dead end


@dataclass
class StructuredOutput:
    """Exactly one of: a JSON schema, any JSON object, a regex, a choice of strings, a grammar."""

    # a plain dict, which pydantic reads as its config: contract/ needs no pydantic
    __pydantic_config__: ClassVar[dict[str, str]] = {"extra": "forbid"}

    json: dict[str, Any] | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None

    @property
    def kinds(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name) not in (None, False)]

    @property
    def key(self) -> str:
        """The constraint's identity: equal constraints compile once."""
        return dumps(asdict(self), sort_keys=True, ensure_ascii=False)


def grammar_text(constraint: StructuredOutput) -> str:
    """llguidance's grammar for ``constraint``; raises ``ValueError`` for a malformed one."""
    return _grammar_text(constraint.key)


def problem(constraint: StructuredOutput) -> str | None:
    """Why the library refuses ``constraint`` (checked without a tokenizer), or None."""
    if len(kinds := constraint.kinds) != 1:
        return f"give exactly one of {', '.join(KINDS)}; got {', '.join(kinds) or 'none'}"
    key = constraint.key
    try:
        key.encode()
    except UnicodeEncodeError:
        return "text must be valid Unicode: it contains a lone surrogate (\\ud800-\\udfff)"
    if any("\x00" in text for text in _texts(asdict(constraint))):  # the database cannot store NUL
        return "text must not contain NUL (\\u0000) characters"
    return _problem(key)


def _texts(value: Any) -> Iterator[str]:
    """Every string in a JSON value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)


@lru_cache(maxsize=1024)
def _problem(key: str) -> str | None:
    from llguidance import LLMatcher

    try:
        text = _grammar_text(key)
    except ValueError as error:
        return str(error)
    is_error, messages = LLMatcher.validate_grammar_with_warnings(text)
    if is_error:
        return messages[0]
    return _walk(LLMatcher(_byte_tokenizer(), text, log_level=0))


def _walk(matcher: Any) -> str | None:
    """Follows the constraint a few bytes, the lowest allowed byte each time, until it accepts: an empty
    language fails at the first byte, and a dead end or a library limit (a rule of thousands of
    alternatives) shows on the way, as it would mid-output."""
    walked = b""
    for _ in range(WALK_BYTES):
        if matcher.is_error() or matcher.is_accepting():
            break
        mask = matcher.compute_bitmask()
        if matcher.is_error() or (byte := _lowest(mask)) is None or byte > 255:
            break
        matcher.consume_token(byte)
        walked += bytes([byte])
    if not matcher.is_error():
        return None
    if not walked:
        return "the constraint matches no text at all: no output could ever satisfy it"
    reason = matcher.get_error().strip().splitlines()[0]
    return f"the constraint fails after {walked.decode(errors='replace')!r}: {reason}"


def _lowest(mask: bytes) -> int | None:
    """The lowest token a bitmask allows (bit t % 32 of little-endian int32 word t // 32), or None."""
    for index, bits in enumerate(mask):
        if bits:
            return index * 8 + (bits & -bits).bit_length() - 1
    return None


@lru_cache(maxsize=1)
def _byte_tokenizer() -> object:
    """A tokenizer of the 256 bytes and an end token, enough to ask whether any text matches."""
    from llguidance import LLTokenizer, TokenizerWrapper

    class Bytes:
        eos_token_id, bos_token_id = 256, None
        tokens: ClassVar = [bytes([byte]) for byte in range(256)] + [b"\xff[end]"]
        special_token_ids: ClassVar = [256]

        def __call__(self, text: bytes) -> list[int]:
            return list(text)

    return LLTokenizer(TokenizerWrapper(Bytes()))


def choice_regex(choices: list[str]) -> str:
    """A regex matching exactly one of ``choices``: every character but letters and digits escaped."""
    return "|".join("".join(c if c.isalnum() else f"\\x{{{ord(c):x}}}" for c in text) for text in choices)


@lru_cache(maxsize=1024)
def _grammar_text(key: str) -> str:
    from json import loads

    from llguidance import LLMatcher, grammar_from

    c = StructuredOutput(**loads(key))
    if c.json is not None:
        return LLMatcher.grammar_from_json_schema(c.json, defaults=JSON_OPTIONS)  # type: ignore[arg-type]
    if c.json_object:
        return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)  # type: ignore[arg-type]
    if c.regex is not None:
        return LLMatcher.grammar_from_regex(c.regex)
    if c.choice is not None:
        if not c.choice:
            raise ValueError("choice must list at least one string")
        return LLMatcher.grammar_from_regex(choice_regex(c.choice))
    return grammar_from("grammar", c.grammar or "")
