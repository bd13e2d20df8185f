import sys
from pathlib import Path

# experiments/ holds the Megatron SC'21 inputs shared by a test and the validation script.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
