"""The ONNX graph in memory: read from a ModelProto (`read`), tidied (`tidy`), written back
reusing the input's protobuf (`write`), loaded and saved with external data (`model`), with the
op families (`ops`), element types (`float_types`) and fresh names (`names`) every layer above
reads them by.

May import: support.
"""
