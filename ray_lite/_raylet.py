"""Ray's ``ray._raylet`` names that programs import directly (``from
ray._raylet import ObjectRefGenerator`` is in Ray's own documentation)."""
from ray_lite._private.process.ids import (ActorClassID, ActorID, FunctionID, JobID,  # noqa: F401
                                   NodeID, PlacementGroupID, TaskID, UniqueID, WorkerID)
from ray_lite._private.api.core import ObjectRef, ObjectRefGenerator  # noqa: F401
from ray_lite._private.objects.dynamic_generator import DynamicObjectRefGenerator  # noqa: F401

ObjectID = ObjectRef
# Ray's older name of the streaming generator.
StreamingObjectRefGenerator = ObjectRefGenerator
