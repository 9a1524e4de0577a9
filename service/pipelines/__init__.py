"""One pipeline per task: validate -> tokenise -> queue -> post-process. Routes only translate."""
