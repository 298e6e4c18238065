"""Messages as the dicts the `trainstep` CLI prints, and specs as the JSON it sends.

Two shapes, as in common/proto_json.h:
  * a Job (get, list, cancel): protobuf's JSON mapping with the .proto field names and every
    field present — what `trainstep job get -o json` prints (64-bit integers are strings);
  * a per-update record (watch, logs): one flat object the way data tools want it — what
    `trainstep job logs -o jsonl` prints: 64-bit integers as numbers, non-finite numbers and
    unset `optional` fields as None (JSON null), keys in .proto order.
Both walk the descriptors, so a field added to the .proto appears here without a change.
"""

import json
import math
import os

from google.protobuf import descriptor as _descriptor
from google.protobuf import json_format

_FD = _descriptor.FieldDescriptor


def message_to_dict(message):
    """Protobuf's JSON mapping, as ToJson() in common/proto_json.cc prints it."""
    return json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        including_default_value_fields=True,
    )


def record_to_dict(record):
    """A flat record (an UpdateRecord) as RecordToJson() in common/proto_json.cc writes it."""
    out = {}
    for field in record.DESCRIPTOR.fields:
        if field.label == _FD.LABEL_REPEATED:
            continue
        value = getattr(record, field.name)
        if field.containing_oneof is not None and not record.HasField(field.name):
            value = None  # an unset `optional` field (eval_loss of an update not evaluated)
        elif field.cpp_type in (_FD.CPPTYPE_DOUBLE, _FD.CPPTYPE_FLOAT):
            value = value if math.isfinite(value) else None
        elif field.cpp_type == _FD.CPPTYPE_ENUM:
            value = field.enum_type.values_by_number[value].name
        elif field.cpp_type == _FD.CPPTYPE_MESSAGE:
            value = message_to_dict(value)
        out[field.name] = value
    return out


def _jsonable(value, path):
    """`value` with what JSON cannot hold made explicit: non-finite floats become the strings
    protobuf's JSON mapping reads ("NaN", "Infinity"), so the coordinator's message names the
    field; paths become strings. Anything else that is not JSON raises TypeError naming where."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{path or 'spec'}: keys must be strings, got {key!r}")
            out[key] = _jsonable(item, f"{path}.{key}" if path else key)
        return out
    if isinstance(value, (list, tuple)):
        return [_jsonable(item, f"{path}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"{path or 'spec'}: {type(value).__name__} cannot be written as JSON, "
                    f"got {value!r}")


def spec_to_json(spec):
    """A spec given as a dict, as the JSON text SubmitJob carries. TypeError names the field
    that JSON cannot hold."""
    if not isinstance(spec, dict):
        raise TypeError(f"spec must be a dict, got {type(spec).__name__}")
    return json.dumps(_jsonable(spec, ""), ensure_ascii=False)
