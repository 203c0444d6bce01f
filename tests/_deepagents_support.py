"""Helpers for the deepagents adapter tests: a scripted chat model and workspace builders."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatResult

__all__ = ["ScriptedModel", "prompt_text", "tool_call"]


def tool_call(name: str, args: dict[str, Any], call_id: str) -> AIMessage:
    """An AI turn that calls one tool."""
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id}])


class ScriptedModel(GenericFakeChatModel):
    """A fake chat model that plays ``script`` turn by turn and keeps what it was sent.

    ``bind_tools`` returns the model itself (the script already says which tools it calls),
    and every prompt is kept in ``prompts`` so a test can check what the agent's
    middleware put there (skills, memories).
    """

    prompts: list[list[BaseMessage]]

    @classmethod
    def playing(cls, script: Sequence[AIMessage]) -> ScriptedModel:
        turns: Iterator[AIMessage | str] = itertools.chain(
            script, itertools.repeat(AIMessage(content="done"))
        )
        return cls(messages=turns, prompts=[])

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedModel:
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.prompts.append(list(messages))
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)


def prompt_text(model: ScriptedModel, index: int = 0) -> str:
    """All the text of the ``index``-th prompt the model was sent."""
    return "\n".join(str(m.content) for m in model.prompts[index])
