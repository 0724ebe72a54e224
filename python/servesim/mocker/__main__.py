"""``python -m servesim.mocker``: the flags of ``python -m dynamo.mocker``, served in-process."""

from servesim.mocker.main import main

if __name__ == "__main__":
    main()
