"""A rendered ValidatingAdmissionPolicy evaluated as kube-apiserver evaluates it: matchConditions,
then the variables, then every validation (an error refuses: failurePolicy Fail), on
AdmissionRequests shaped as the API server builds them. The CEL is run by cel-python: the chart's
expressions use standard CEL but in their messages (the strings extension's join), where an
expression cel-python cannot run leaves the rule's static message."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import celpy

Obj = dict[str, Any]

#: the reasons a validation may give (the API server refuses a policy with any other)
REASONS = ("Unauthorized", "Forbidden", "Invalid", "RequestEntityTooLarge")


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    message: str = ""
    #: the validation's reason, where one refused (not compared: the message says which)
    reason: str = field(default="", compare=False)


def _equal(a: Any, b: Any) -> Any:
    """CEL's heterogeneous equality, as cel-go (kube-apiserver) has it: `object != null` is
    true for an object, where cel-python finds no overload for a map and null."""
    if a is None or b is None:
        return celpy.celtypes.BoolType(a is None and b is None)
    return celpy.evaluation.bool_eq(a, b)


def _not_equal(a: Any, b: Any) -> Any:
    same = _equal(a, b)
    return same if isinstance(same, celpy.CELEvalError) else celpy.celtypes.BoolType(not same)


class Policy:
    """One rendered ValidatingAdmissionPolicy."""

    def __init__(self, vap: Obj) -> None:
        self.spec = vap["spec"]
        self._env = celpy.Environment()

    def _eval(self, expr: str, activation: dict[str, Any]) -> Any:
        program = self._env.program(self._env.compile(expr),
                                    functions={"_==_": _equal, "_!=_": _not_equal})
        return program.evaluate(activation)

    def matches(self, request: Obj) -> bool:
        for rule in self.spec["matchConstraints"]["resourceRules"]:
            resource = request["resource"]["resource"]
            if request.get("subResource"):
                resource += "/" + request["subResource"]
            if resource in rule["resources"] and request["operation"] in rule["operations"]:
                return True
        return False

    def admit(self, request: Obj, obj: Obj | None, old: Obj | None) -> Verdict:
        if not self.matches(request):
            return Verdict(True, "not matched")
        base = {"request": celpy.json_to_cel(request), "object": celpy.json_to_cel(obj),
                "oldObject": celpy.json_to_cel(old)}
        for cond in self.spec.get("matchConditions", []):
            if not bool(self._eval(cond["expression"], base)):
                return Verdict(True, "not matched")
        variables: dict[str, Any] = {}
        for var in self.spec.get("variables", []):
            activation = {**base, "variables": celpy.celtypes.MapType(
                {celpy.celtypes.StringType(k): v for k, v in variables.items()})}
            variables[var["name"]] = self._eval(var["expression"], activation)
        activation = {**base, "variables": celpy.celtypes.MapType(
            {celpy.celtypes.StringType(k): v for k, v in variables.items()})}
        for rule in self.spec["validations"]:
            try:
                ok = self._eval(rule["expression"], activation)
            except celpy.CELEvalError as exc:
                assert self.spec["failurePolicy"] == "Fail"
                return Verdict(False, f"error: {exc}")
            if isinstance(ok, celpy.CELEvalError):
                assert self.spec["failurePolicy"] == "Fail"
                return Verdict(False, f"error: {ok}")
            if not bool(ok):
                assert rule["reason"] in REASONS, rule
                message = rule["message"]
                if "messageExpression" in rule:
                    try:
                        said = self._eval(rule["messageExpression"], activation)
                    except celpy.CELEvalError:
                        said = None  # (the API server then gives the static message too)
                    if isinstance(said, str):
                        message = str(said)
                return Verdict(False, message, rule["reason"])
        return Verdict(True)
