import sys

try:
    from .cli import main

    code = main()
except KeyboardInterrupt:  # Ctrl-C outside the campaign's own handler (while the modules load)
    print("chaos: interrupted", file=sys.stderr)
    code = 130
sys.exit(code)
