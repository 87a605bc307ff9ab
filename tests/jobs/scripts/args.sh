# A shell program: records its arguments and a few variables in the model.
echo "shell says hello"
printf '%s\n' "$@" > "$SM_MODEL_DIR/args.txt"
echo "$SM_CURRENT_HOST $TRAINING_JOB_NAME" > "$SM_MODEL_DIR/env.txt"
