"""What every layer uses: qdq's errors, the progress line, atomic output files, path arguments, and
onnxruntime sessions that Ctrl-C can interrupt.

May import: nothing else in qdq.
"""
