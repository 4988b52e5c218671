# Lets `pytest python/tests` import the flash3 package from this checkout.
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
