"""Entry point: python train.py fit --config configs/textcraft/ascent.yaml"""
from lit_ascent.cli import main

if __name__ == "__main__":
    main()
