"""Entry point: python train.py fit --config configs/textcraft/ascent.yaml"""
from lit_ascent.cli import main, show_package_logs

if __name__ == "__main__":
    show_package_logs()
    main()
