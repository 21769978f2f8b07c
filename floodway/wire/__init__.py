"""What crosses the wire, written once for both sides: task JSON (``tasks``), problem types
(``problems``), the OpenAI-compatible shapes (``openai``) and webhook signatures (``signing``)."""
