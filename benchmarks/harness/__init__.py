"""The binaries' harness, below every binary and imports no TensorFlow: settings
declared once as typed fields that carry their flag (`spec`)."""
