"""The console's modal screens: confirm, pick one of a list, the start-a-server form.

Confirm guards a destructive action; pick chooses a check or an admin route. Each
dismisses with its answer (None: cancelled); the caller acts on it.
"""

from __future__ import annotations

from typing import TypeVar

from rich.markup import escape
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from opsctl.console.servers import StartRequest
from opsctl.errors import BadInput

_BOX = "align: center middle; } #box { width: 90; height: auto; border: thick $warning; padding: 1 2; background: $panel; }"

T = TypeVar("T")


class CancelScreen(ModalScreen[T | None]):
    """A modal whose Esc (and :meth:`action_cancel`) dismisses it with None."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    @staticmethod
    def accent_css(selector: str, extra: str) -> str:
        """The DEFAULT_CSS of a modal named ``selector``: the centred box, accent border."""
        return selector + " { " + _BOX.replace("$warning", "$accent") + extra

    def action_cancel(self) -> None:
        """Dismiss with None: cancelled."""
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    """y / Enter on "Yes" confirms; n / Esc cancels."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n", "answer(False)", "No"),
        Binding("escape", "answer(False)", "Cancel"),
    ]
    DEFAULT_CSS = "ConfirmScreen { " + _BOX + " #buttons { height: auto; margin-top: 1; }"

    def __init__(self, question: str, detail: str = "") -> None:
        super().__init__()
        self.question = question
        self.detail = detail

    def compose(self) -> ComposeResult:
        """The question, its detail and the Yes / No buttons."""
        with Vertical(id="box"):
            yield Static(f"[b]{escape(self.question)}[/b]", id="question")
            if self.detail:
                yield Static(escape(self.detail), id="detail")
            with Horizontal(id="buttons"):
                yield Button("Yes (y)", variant="error", id="yes")
                yield Button("No (n, Esc)", variant="primary", id="no")

    def on_mount(self) -> None:
        """Focus "No": Enter alone does not confirm."""
        self.query_one("#no", Button).focus()

    def action_answer(self, yes: bool) -> None:
        """Dismiss with ``yes`` (the y, n and Esc keys)."""
        self.dismiss(yes)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        """Dismiss with True for "Yes", False for "No"."""
        self.dismiss(event.button.id == "yes")


class PickScreen(CancelScreen[str]):
    """One of ``choices`` ((id, label) pairs); Esc cancels."""

    DEFAULT_CSS = CancelScreen.accent_css(
        "PickScreen", " OptionList { height: auto; max-height: 20; }"
    )

    def __init__(self, title: str, choices: list[tuple[str, str]], note: str = "") -> None:
        super().__init__()
        self.title_text = title
        self.choices = choices
        self.note = note

    def compose(self) -> ComposeResult:
        """The title, the choices as an option list and the note."""
        with Vertical(id="box"):
            yield Static(f"[b]{escape(self.title_text)}[/b]")
            yield OptionList(*(Option(escape(label), id=cid) for cid, label in self.choices))
            if self.note:
                yield Static(escape(self.note), id="note")

    def on_mount(self) -> None:
        """Focus the choices."""
        self.query_one(OptionList).focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        """Dismiss with the picked choice's id."""
        self.dismiss(event.option.id)


class StartServerScreen(CancelScreen[StartRequest]):
    """Model (embedded name or directory), weights (dummy | real), port (empty: free)."""

    DEFAULT_CSS = CancelScreen.accent_css(
        "StartServerScreen", " Input { margin-bottom: 1; } #error { color: $error; }"
    )

    def __init__(self, models: list[str], api_key: str | None = None) -> None:
        super().__init__()
        self.models = models
        self.api_key = api_key

    def compose(self) -> ComposeResult:
        """The form: model, weights and port inputs, an error line, Start and Cancel."""
        with Vertical(id="box"):
            yield Static("[b]start a vLLM server[/b] (it stops when the console exits)")
            yield Label(f"model: an embedded name ({', '.join(self.models)}) or a directory")
            yield Input(value="tiny-llama", id="model")
            yield Label("weights: dummy (fast, random) or real (the model's own)")
            yield Input(value="dummy", id="weights")
            yield Label("port (empty: a free one)")
            yield Input(value="", id="port")
            yield Static("", id="error")
            with Horizontal():
                yield Button("Start", variant="success", id="start")
                yield Button("Cancel (Esc)", id="cancel")

    def on_mount(self) -> None:
        """Focus the model input."""
        self.query_one("#model", Input).focus()

    def request(self) -> StartRequest:
        """The form as a StartRequest; BadInput for an empty model or a port not a number."""
        model = self.query_one("#model", Input).value.strip()
        weights = self.query_one("#weights", Input).value.strip() or "dummy"
        port_text = self.query_one("#port", Input).value.strip()
        if not model:
            raise BadInput("give a model")
        if port_text and not port_text.isdigit():
            raise BadInput(f"port must be a number, not {port_text!r}")
        port = int(port_text) if port_text else None
        return StartRequest(model=model, weights=weights, port=port, api_key=self.api_key)

    def _submit(self) -> None:
        try:
            self.dismiss(self.request())
        except BadInput as exc:
            self.query_one("#error", Static).update(escape(exc.message))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter in any input submits the form."""
        event.stop()
        self._submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        """Start submits the form; Cancel dismisses with None."""
        if event.button.id == "start":
            self._submit()
        else:
            self.dismiss(None)
