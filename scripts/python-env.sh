# Sourced (not run) by every script that starts Python: it names kolo's one
# Python environment, the virtual environment scripts/install-deps.sh makes.
#   KOLO_PYTHON   the interpreter to use (default: $KOLO_VENV/bin/python)
#   KOLO_VENV     where the environment lives (default: /opt/kolo/venv,
#                 or ~/.local/share/kolo/venv when /opt/kolo is not writable)
# After sourcing, KOLO_PYTHON is set and exported.
if [ -z "${KOLO_VENV:-}" ]; then
  if [ -n "${KOLO_PYTHON:-}" ] && [ "$(basename "$(dirname "$KOLO_PYTHON")")" = bin ]; then
    KOLO_VENV=$(dirname "$(dirname "$KOLO_PYTHON")")
  elif [ -w /opt ] || [ -w /opt/kolo ] 2>/dev/null; then
    KOLO_VENV=/opt/kolo/venv
  else
    KOLO_VENV=${XDG_DATA_HOME:-$HOME/.local/share}/kolo/venv
  fi
fi
KOLO_PYTHON=${KOLO_PYTHON:-$KOLO_VENV/bin/python}
export KOLO_VENV KOLO_PYTHON
