from kerneldev.sandbox.service.app import main

main()
