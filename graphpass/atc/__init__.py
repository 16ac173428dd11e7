"""The hand-off to ATC and back (issue 27): the conversion kit (:mod:`.kit`), the operator check
and opset conversion (:mod:`.opcheck`), shape profiles as ATC gears (:mod:`.gears`), and the
read-back of what ATC did (:mod:`.readback`)."""

from graphpass.atc.gears import Gears, parse_profile, plan_gears
from graphpass.atc.kit import Kit, check_command, read_kit, write_kit
from graphpass.atc.opcheck import OpCheck, Refusal, check_ops, fit_opset

__all__ = ["Gears", "Kit", "OpCheck", "Refusal", "check_command", "check_ops", "fit_opset", "parse_profile",
           "plan_gears", "read_kit", "write_kit"]
