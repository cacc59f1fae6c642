from hookledger.cli import main

main(prog_name="hookledger")
