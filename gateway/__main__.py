from agent_gateway.cli import main

main()
