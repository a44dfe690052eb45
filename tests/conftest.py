from __future__ import annotations

import sys
from pathlib import Path

# helpers shared by test modules (search_helpers, llm_server, ...) live beside the tests
sys.path.insert(0, str(Path(__file__).parent))
