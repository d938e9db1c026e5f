"""Policy: the versioned schema, loading, validation, host patterns and decisions.

This package does no I/O beyond reading policy files and imports nothing else of stockade
except the exception tree.
"""

from stockade.policy._decision import Decision as Decision
from stockade.policy._decision import Reason as Reason
from stockade.policy._decision import Verdict as Verdict
from stockade.policy._load import load_policy as load_policy
from stockade.policy._load import parse_policy_text as parse_policy_text
from stockade.policy._load import user_policy_path as user_policy_path
from stockade.policy._model import DETECTOR_NAMES as DETECTOR_NAMES
from stockade.policy._model import LAYERS as LAYERS
from stockade.policy._model import BoundSecret as BoundSecret
from stockade.policy._model import EnvPass as EnvPass
from stockade.policy._model import EnvPolicy as EnvPolicy
from stockade.policy._model import FilesystemPolicy as FilesystemPolicy
from stockade.policy._model import InspectPolicy as InspectPolicy
from stockade.policy._model import Labels as Labels
from stockade.policy._model import LayersPolicy as LayersPolicy
from stockade.policy._model import LimitsPolicy as LimitsPolicy
from stockade.policy._model import NetworkPolicy as NetworkPolicy
from stockade.policy._model import Policy as Policy
from stockade.policy._model import RequestRule as RequestRule

__all__ = [
    "DETECTOR_NAMES",
    "LAYERS",
    "BoundSecret",
    "Decision",
    "EnvPass",
    "EnvPolicy",
    "FilesystemPolicy",
    "InspectPolicy",
    "Labels",
    "LayersPolicy",
    "LimitsPolicy",
    "NetworkPolicy",
    "Policy",
    "Reason",
    "RequestRule",
    "Verdict",
    "load_policy",
    "parse_policy_text",
    "user_policy_path",
]
