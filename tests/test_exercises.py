"""autograd_lens.exercises: an Exercise says Right / Not quite and the rule, never the value, and computes the value
with torch when the answer is checked; the course's exercises are checked against their stored solutions."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import torch

from autograd_lens.exercises import Exercise

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"

CUBE = Exercise("x.grad for x³ at x = 4?", program="x = torch.tensor(4.0, requires_grad=True)\n(x ** 3).backward()",
                value="x.grad", rule="The derivative of x³ is 3x².",
                mistakes=[("x.grad / 3", "You dropped the factor 3 of 3x².")])


def verdict(exercise: Exercise, answer, capsys) -> str:
    exercise.check(answer)
    return capsys.readouterr().out


def test_right_and_not_quite_with_the_rule_and_never_the_value(capsys):
    assert verdict(CUBE, 48, capsys) == "Right. The derivative of x³ is 3x².\n"
    assert verdict(CUBE, torch.tensor(48.0), capsys).startswith("Right.")
    wrong = verdict(CUBE, 47, capsys)
    assert wrong == "Not quite. The derivative of x³ is 3x².\n"
    assert "48" not in wrong


def test_a_known_mistake_is_explained(capsys):
    assert verdict(CUBE, 16, capsys) == "Not quite. You dropped the factor 3 of 3x². The derivative of x³ is 3x².\n"


def test_no_answer_yet_says_the_form_not_the_value(capsys):
    text = verdict(CUBE, ..., capsys)
    assert text.startswith("No answer yet") and "a number" in text and "48" not in text
    vector = Exercise("v", program="v = torch.tensor([1.0, 2.0, 3.0])", value="v * 7", rule="r")
    assert "a list of 3 numbers" in verdict(vector, ..., capsys)


def test_lists_shapes_and_tolerance(capsys):
    vector = Exercise("v", program="v = torch.tensor([[1.0, 2.0], [3.0, 4.0]])", value="v / 3", rule="r")
    assert vector.is_right([[1 / 3, 2 / 3], [1.0, 4 / 3]])
    assert vector.is_right([[0.33334, 0.66667], [1.0, 1.33333]])  # within the default tolerance 1e-4
    assert not vector.is_right([[0.34, 0.67], [1.0, 1.33]])
    assert not vector.is_right([1 / 3, 2 / 3, 1.0, 4 / 3])  # right numbers, wrong shape
    assert "shape [2, 2], your answer [4]" in verdict(vector, [1 / 3, 2 / 3, 1.0, 4 / 3], capsys)
    assert "Please answer with a nested list" in verdict(vector, "two by two", capsys)


def test_booleans_none_dtypes_names_and_exceptions():
    assert Exercise("b", program="t = torch.ones(1)", value="t.grad is None").is_right(True)
    assert not Exercise("b", program="t = torch.ones(1)", value="t.grad is None").is_right(1)  # 1 is not True
    assert Exercise("n", program="t = torch.ones(1)", value="t.grad").is_right(None)
    dtype = Exercise("d", program="t = torch.ones(1, dtype=torch.bfloat16)", value="t.dtype")
    assert dtype.is_right(torch.bfloat16) and dtype.is_right("bfloat16") and dtype.is_right("torch.bfloat16")
    assert not dtype.is_right(torch.float16)
    name = Exercise("s", program="t = torch.ones(1, requires_grad=True)", value="(t * 2).grad_fn.name()")
    assert name.is_right("MulBackward0") and name.is_right(" mulbackward0 ") and not name.is_right("AddBackward0")
    raises = Exercise("e", program="torch.ones(2).backward()")  # no grad_fn: RuntimeError
    assert raises.expected() is RuntimeError
    assert raises.is_right("RuntimeError") and raises.is_right(RuntimeError) and not raises.is_right("TypeError")


def test_the_value_is_computed_by_torch_at_check_time():
    scale = [2.0]
    exercise = Exercise("x.grad", program="x = torch.tensor(1.0, requires_grad=True)\n(x * k[0]).backward()",
                        value="x.grad", names={"k": scale})
    assert exercise.is_right(2.0)
    scale[0] = 5.0
    assert exercise.is_right(5.0) and not exercise.is_right(2.0)
    assert Exercise("f", program=lambda: torch.tensor(3.0) * 2).is_right(6)


def test_check_is_quiet_and_never_raises(capsys):
    noisy = Exercise("n", program="print('from the program')\nimport warnings\nwarnings.warn('w')\nv = 1", value="v")
    assert verdict(noisy, 1, capsys) == "Right.\n"

    class Unreadable:
        def __eq__(self, other):
            raise ValueError("no comparison")

    text = verdict(Exercise("o", program="v = object()", value="v"), Unreadable(), capsys)
    assert text.startswith("Could not check this answer (ValueError")


# --- the course's exercises -----------------------------------------------------------------------------------

def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


def output_text(cell: dict) -> str:
    return "".join("".join(o.get("text", "")) for o in cell.get("outputs", []) if o["output_type"] == "stream")


def exercise_cells(path: Path) -> list[dict]:
    return [c for c in cells(path) if c["cell_type"] == "code" and "exercise" in c["metadata"].get("tags", [])]


def definition(cell: dict) -> tuple[str, str, str]:
    """(exercise name, the source defining it, the answer passed to check) of an exercise or solution cell."""
    text = source(cell)
    name, answer = re.search(r"^(\w+)\.check\((.*?)\)", text, re.M).groups()
    defined = text[: text.index(f"{name}.check(")].replace("from autograd_lens.exercises import Exercise\n", "")
    return name, defined.strip(), answer


COURSE = sorted(path for path in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb") if exercise_cells(path))


def solutions_of(path: Path) -> list[dict]:
    own = NOTEBOOKS / "solutions" / path.name
    shared = NOTEBOOKS / "solutions" / "00-08_more_exercises.ipynb"
    return [c for c in cells(own if own.exists() else shared) if c["cell_type"] == "code"]


def test_the_course_has_checked_exercises_in_every_notebook():
    numbered = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    assert [p.name for p in COURSE] == [p.name for p in numbered]
    assert all(len(exercise_cells(p)) >= 2 for p in COURSE)


@pytest.mark.parametrize("path", COURSE, ids=lambda path: path.stem)
def test_each_exercise_is_unanswered_in_the_lesson_and_right_in_its_solution(path):
    solutions = {definition(c)[1]: c for c in solutions_of(path) if re.search(r"^\w+\.check\(", source(c), re.M)}
    for cell in exercise_cells(path):
        name, defined, answer = definition(cell)
        assert answer == "...", f"{path.name}: {name} is answered in the lesson"
        assert output_text(cell).startswith("No answer yet"), f"{path.name}: {name}"
        solution = solutions.get(defined)
        assert solution is not None, f"{path.name}: {name} has no solution cell with the same definition"
        assert output_text(solution).startswith("Right."), f"{path.name}: {name}'s solution is not right"


@pytest.mark.parametrize("path", COURSE, ids=lambda path: path.stem)
def test_no_exercise_gives_its_value_away(path):
    """The question and the rule (printed by check) never contain the value, and the answers are right now."""
    for cell in exercise_cells(path):
        name, defined, _ = definition(cell)
        namespace: dict = {"Exercise": Exercise}
        exec(compile(defined, f"{path.name}:{name}", "exec"), namespace)
        exercise = namespace[name]
        answer = next(definition(c)[2] for c in solutions_of(path)
                      if re.search(r"^\w+\.check\(", source(c), re.M) and definition(c)[1] == defined)
        assert exercise.is_right(eval(answer, {"torch": torch})), f"{path.name}: {name}"
        value = exercise.expected()
        if isinstance(value, torch.Tensor) and value.numel() == 1 or isinstance(value, float):
            number = float(value)
            if abs(number) >= 10 or number != int(number):
                forms = {f"{number:g}", f"{number:.2f}", f"{number:.3g}"}
                said = " ".join([exercise.question, exercise.rule, *(why for _, why in exercise.mistakes)])
                leaked = [form for form in forms if re.search(rf"(?<![\d.]){re.escape(form)}(?![\d])", said)]
                assert not leaked, f"{path.name}: {name} says {leaked}"


def test_exercise_sources_parse_and_define_one_exercise_each():
    for path in COURSE:
        for cell in exercise_cells(path):
            tree = ast.parse(definition(cell)[1])
            assert [type(node).__name__ for node in tree.body] == ["Assign"], path.name
